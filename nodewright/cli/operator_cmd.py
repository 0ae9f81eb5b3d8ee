"""`nodewright operator`: run the controller manager (kubeconfig or in-cluster).

The wiring of informers and controllers is in `wire()`: that is where reconcilers slot in. Until the
real reconcilers land, one controller logs each NodeWright key it sees, which exercises caches,
queue, workers and leader election end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from nodewright.api import constants


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("operator", help="run the NodeWright operator (controller manager)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster config)")
    parser.add_argument(
        "--namespace", default="nodewright-system", help="namespace of the package pods and the Lease"
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect a leader with a coordination.k8s.io Lease (default: on)",
    )
    parser.add_argument("--lease-name", default="nodewright-operator")
    parser.add_argument("--lease-duration", type=float, default=15.0)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--health-probe-bind-address", default=":8081", help="'0' disables the probes")
    parser.add_argument("--metrics-bind-address", default=":8080", help="Prometheus metrics address")
    parser.add_argument("--qps", type=float, default=50.0, help="client-side write QPS limit")
    parser.add_argument("--burst", type=int, default=100, help="client-side write burst")
    parser.add_argument("--workers", type=int, default=4, help="workers per controller")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish in-flight work")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def configure_logging(level: str) -> None:
    import structlog

    numeric = logging.getLevelName(level.upper())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    return asyncio.run(_main(args))


def wire(manager: Any, *, namespace: str, workers: int = 1) -> None:
    """Informers and controllers of the operator (reconcilers plug in here)."""
    import structlog

    from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODES, NODEWRIGHTS, PODS
    from nodewright.kube.trim import trim_node, trim_pod
    from nodewright.kube.workqueue import Result

    log = structlog.get_logger("nodewright.operator")
    nodewrights = manager.informer(NODEWRIGHTS)
    manager.informer(DEPLOYMENTPOLICIES)
    manager.informer(NODES, transform=trim_node)
    pods = manager.informer(
        PODS,
        namespace=namespace,
        label_selector=f"{constants.POD_OWNER_LABEL}={constants.POD_OWNER_VALUE}",
        transform=trim_pod,
    )
    pods.add_index("node", lambda pod: [pod["spec"].get("nodeName") or ""])

    async def reconcile(key: str) -> Result | None:
        obj = nodewrights.get(key)
        generation = (obj or {}).get("metadata", {}).get("generation")
        log.info("reconcile", exists=obj is not None, generation=generation)
        return None

    controller = manager.controller("nodewright", reconcile, workers=workers)
    controller.watch(nodewrights)


async def _main(args: argparse.Namespace) -> int:
    import structlog

    from nodewright.controller.manager import LeaderElectionConfig, Manager
    from nodewright.kube.client import KubeClient
    from nodewright.kube.config import ConfigError, load_config

    log = structlog.get_logger("nodewright.operator")
    try:
        config = load_config(args.kubeconfig)
    except ConfigError as exc:
        log.error("cannot load cluster configuration", error=str(exc))
        return 2
    client = KubeClient(config, qps=args.qps, burst=args.burst)
    election = (
        LeaderElectionConfig(
            namespace=args.namespace,
            name=args.lease_name,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        if args.leader_elect
        else None
    )
    manager = Manager(
        client,
        leader_election=election,
        health_bind_address=args.health_probe_bind_address,
        drain_timeout=args.drain_timeout,
    )
    wire(manager, namespace=args.namespace, workers=args.workers)
    log.info(
        "starting operator",
        server=config.server,
        namespace=args.namespace,
        leader_elect=args.leader_elect,
        identity=election.identity if election else None,
    )
    return await manager.run()
