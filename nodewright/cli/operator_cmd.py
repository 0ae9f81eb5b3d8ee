"""`nodewright operator`: run the controller manager (kubeconfig or in-cluster).

The wiring of informers and controllers is in `nodewright.controller.operator`; this module parses
flags, sets up logging, metrics (`--metrics-bind-address`), tracing (OTLP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set) and the pod-signing key, then runs the Manager until SIGTERM or
loss of leadership.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from nodewright.controller.context import OperatorOptions

_DEFAULTS = OperatorOptions()


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
    parser.add_argument("--workers", type=int, default=4, help="workers of the rollout controller")
    parser.add_argument(
        "--node-workers",
        type=int,
        default=64,
        help="concurrent node reconciles: each mostly awaits the API server (writes stay under --qps)",
    )
    parser.add_argument(
        "--event-qps", type=float, default=10.0, help="Event write rate (separate from --qps; best effort)"
    )
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish in-flight work")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    parser.add_argument("--agent-image", default=_DEFAULTS.agent_image, help="image of the stage agent")
    parser.add_argument("--pause-image", default=_DEFAULTS.pause_image, help="main container image")
    parser.add_argument(
        "--runtime-required-taint",
        default=_DEFAULTS.runtime_required_taint,
        help="taint (key[=value]:Effect) kept on nodes until runtime-required NodeWrights complete",
    )
    parser.add_argument("--copy-dir-root", default=_DEFAULTS.copy_dir_root)
    parser.add_argument("--log-root", default=_DEFAULTS.log_root)
    parser.add_argument(
        "--reboot-timeout",
        type=float,
        default=_DEFAULTS.reboot_timeout,
        help="seconds a node may take to come back from a reboot before it is reported erroring",
    )
    parser.add_argument(
        "--reapply-on-reboot",
        action="store_true",
        help="re-run every package after a reboot (immutable OS images)",
    )
    parser.add_argument("--resync-seconds", type=float, default=_DEFAULTS.resync_seconds)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodewright.controller.context import parse_taint
    from nodewright.observability.logging import configure_logging

    fmt = {"auto": None, "json": True, "console": False}[args.log_format]
    configure_logging(args.log_level, json=fmt)
    try:
        parse_taint(args.runtime_required_taint)
    except ValueError as exc:
        print(f"nodewright operator: --runtime-required-taint: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    import structlog

    from nodewright.controller.context import PodSigner
    from nodewright.controller.manager import LeaderElectionConfig, Manager
    from nodewright.controller.operator import Operator, load_signing_key
    from nodewright.kube.client import KubeClient
    from nodewright.kube.config import ConfigError, load_config
    from nodewright.observability.loop_lag import EventLoopLagMonitor
    from nodewright.observability.metrics import OperatorMetrics
    from nodewright.observability.server import parse_bind_address, start_metrics_server
    from nodewright.observability.tracing import RolloutTracer

    log = structlog.get_logger("nodewright.operator")
    try:
        config = load_config(args.kubeconfig)
    except ConfigError as exc:
        log.error("cannot load cluster configuration", error=str(exc))
        return 2
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
    identity = election.identity if election else "nodewright-operator"
    metrics = OperatorMetrics(service_instance=identity)
    tracer = RolloutTracer.from_environment(service_instance=identity)
    client = KubeClient(config, qps=args.qps, burst=args.burst, metrics=metrics.requests)
    # Events get their own client and rate limit: a burst of events must not delay state transitions.
    event_client = KubeClient(
        config, qps=args.event_qps, burst=max(1, int(args.event_qps * 2)), metrics=metrics.requests
    )
    options = OperatorOptions(
        namespace=args.namespace,
        agent_image=args.agent_image,
        pause_image=args.pause_image,
        runtime_required_taint=args.runtime_required_taint,
        copy_dir_root=args.copy_dir_root,
        log_root=args.log_root,
        reboot_timeout=args.reboot_timeout,
        reapply_on_reboot=args.reapply_on_reboot,
        resync_seconds=args.resync_seconds,
    )
    manager = Manager(
        client,
        leader_election=election,
        health_bind_address=args.health_probe_bind_address,
        drain_timeout=args.drain_timeout,
        watch_metrics=metrics.watches,
        workqueue_metrics=metrics.workqueues,
        leader_metrics=metrics.leader,
        reconcile_metrics=metrics,
    )
    metrics_runner = None
    bind = parse_bind_address(args.metrics_bind_address)
    if bind is not None:
        metrics_runner = await start_metrics_server(metrics, *bind)
    lag = EventLoopLagMonitor(metrics, interval=0.5)
    lag.start()
    operator: Operator | None = None
    try:
        key = await load_signing_key(client, args.namespace)
        operator = Operator(
            manager,
            options=options,
            metrics=metrics,
            tracer=tracer,
            signer=PodSigner(key),
            workers=args.workers,
            node_workers=args.node_workers,
            instance=identity,
            event_client=event_client,
        )
        log.info(
            "starting operator",
            server=config.server,
            namespace=args.namespace,
            leader_elect=args.leader_elect,
            identity=identity,
        )
        return await manager.run()
    finally:
        if operator is not None:
            await operator.rt.events.close()
        await event_client.close()
        await lag.stop()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await tracer.aclose()
        await asyncio.to_thread(metrics.shutdown)
