"""`nodewright operator`: run the controller manager (kubeconfig or in-cluster).

The wiring of informers and controllers is in `nodewright.controller.operator`; this module turns
flags into a running Manager in four named steps:

1. `validate_flags`: ranges and formats are argparse types (`nodewright.cli.flags`); what one flag
   cannot see alone is checked here (the Lease timings must nest: duration > renew deadline > 1.2 x
   retry period, as client-go requires).
2. `load_cluster_config`: the kubeconfig (or in-cluster service account) must load, with a CA, client
   certificate and key that parse.
3. `build_runtime`: metrics, tracing (OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set), the API
   clients and the Manager; the metrics and health-probe listeners are bound here, so a taken port is
   reported before anything else starts. Every resource is registered on one exit stack, so every
   client session is closed on every path (success, bad flag, SIGTERM, start-up failure).
4. `run_operator`: the Manager's start-up step waits for the API server (jittered exponential backoff,
   one log line per attempt, forever: see `Manager.until_reachable`), checks that the NodeWright API
   is served and loads (or creates) the pod-signing key in `--namespace`, then registers the
   controllers; the Manager runs until SIGTERM or loss of leadership.

Every failure that retrying cannot fix -- a bad flag, a port in use, a kubeconfig that does not load,
credentials the API server rejects, missing RBAC, a namespace or CRD that does not exist -- ends with
one line on stderr naming the flag or object and what to do, and exit status 2. An outage is not
such a failure: the operator waits for the API server at start-up, and with `--no-leader-elect` it
never exits over one (see docs/operations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodewright.cli import flags
from nodewright.cli.flags import UsageError
from nodewright.controller.options import OperatorOptions

if TYPE_CHECKING:
    from nodewright.controller.manager import Manager
    from nodewright.kube.client import KubeClient
    from nodewright.kube.config import ClusterConfig
    from nodewright.kube.resources import ApiError
    from nodewright.observability.metrics import OperatorMetrics
    from nodewright.observability.tracing import RolloutTracer

PROG = "nodewright operator"
LEASE_JITTER_FACTOR = 1.2
"""client-go's leader-election JitterFactor: the renew deadline must exceed 1.2 retry periods."""
PROBE_TIMEOUT = 10.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("operator", help="run the NodeWright operator (controller manager)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster config)")
    flags.add_switch(
        parser,
        "--leader-elect",
        default=True,
        help="elect a leader with a coordination.k8s.io Lease (default: on; --no-leader-elect turns it off)",
    )
    parser.add_argument("--lease-name", type=flags.dns_subdomain, default="nodewright-operator")
    parser.add_argument(
        "--lease-duration",
        type=flags.float_at_least(1.0),
        default=15.0,
        help="seconds a standby waits before taking over a lease that is not renewed",
    )
    parser.add_argument(
        "--renew-deadline",
        type=flags.positive_float,
        default=10.0,
        help="seconds the leader keeps retrying a renewal before it stops leading (< --lease-duration)",
    )
    parser.add_argument(
        "--retry-period", type=flags.positive_float, default=2.0, help="seconds between lease attempts"
    )
    parser.add_argument(
        "--health-probe-bind-address",
        type=flags.bind_address,
        default=":8081",
        help="[host]:port of /healthz and /readyz; '0' disables the probes",
    )
    parser.add_argument(
        "--metrics-bind-address",
        type=flags.bind_address,
        default=":8080",
        help="[host]:port of Prometheus /metrics; '0' disables it",
    )
    parser.add_argument("--qps", type=flags.positive_float, default=50.0, help="client-side write QPS limit")
    parser.add_argument("--burst", type=flags.positive_int, default=100, help="client-side write burst")
    parser.add_argument(
        "--workers", type=flags.positive_int, default=4, help="workers of the rollout controller"
    )
    parser.add_argument(
        "--node-workers",
        type=flags.positive_int,
        default=64,
        help="concurrent node reconciles: each mostly awaits the API server (writes stay under --qps)",
    )
    parser.add_argument(
        "--event-qps",
        type=flags.positive_float,
        default=10.0,
        help="Event write rate (separate from --qps; best effort)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=flags.non_negative_float,
        default=30.0,
        help="seconds to finish in-flight work on shutdown",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    parser.add_argument(
        "--notify-url-secret",
        metavar="SECRET/KEY",
        default=None,
        help="a cluster-wide notification sink told about every NodeWright: the key of a Secret in the"
        " operator's namespace whose value is the webhook URL (docs/rollout.md, Notifications)",
    )
    parser.add_argument(
        "--notify-format",
        choices=["json", "slack"],
        default="json",
        help='payload of the cluster-wide sink: json, or slack ({"text": ...})',
    )
    parser.add_argument(
        "--notify-events",
        metavar="EVENT,...",
        default=None,
        help="events the cluster-wide sink gets (default all): RolloutStarted, BatchSettled, NodeFailed,"
        " CompartmentHalted, DrainBlocked, RolloutCompleted",
    )
    add_option_flags(parser)
    parser.set_defaults(func=run)


KINDS: dict[str, Callable[[str], Any]] = {
    "dns_label": flags.dns_label,
    "image": flags.image_reference,
    "taint": flags.taint,
    "path": flags.absolute_path,
    "positive_float": flags.positive_float,
    "float_at_least_1": flags.float_at_least(1.0),
    "int_at_least_1": flags.int_at_least(1),
}
"""How each kind of `OperatorOptions` value is read from the command line (`switch`: --x / --no-x)."""


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `OperatorOptions` field, from its definition (`controller.options.option`)."""
    for spec in dataclasses.fields(OperatorOptions):
        meta = spec.metadata
        text = f"{meta['help']} (default {_shown(spec.default)}: {meta['why']})"
        if meta["kind"] == "switch":
            flags.add_switch(parser, meta["flag"], default=bool(spec.default), help=text)
        else:
            parser.add_argument(meta["flag"], type=KINDS[meta["kind"]], default=spec.default, help=text)


def options_from(args: argparse.Namespace) -> OperatorOptions:
    """The `OperatorOptions` the flags of `add_option_flags` give."""
    return OperatorOptions(
        **{
            spec.name: getattr(args, spec.metadata["flag"].removeprefix("--").replace("-", "_"))
            for spec in dataclasses.fields(OperatorOptions)
        }
    )


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    from nodewright.observability.heap import (
        glibc,
        import_http_client,
        shrink_tls_read_buffers,
        tune_allocator,
    )

    tune_allocator(glibc())  # before any thread starts: arenas are per thread (observability/heap.py)
    import_http_client()  # first, without the CA bundle in aiohttp's unused default contexts
    shrink_tls_read_buffers()
    from nodewright.observability.logging import configure_logging

    fmt = {"auto": None, "json": True, "console": False}[args.log_format]
    configure_logging(args.log_level, json=fmt)
    try:
        validate_flags(args)
        config = load_cluster_config(args)
        return asyncio.run(_main(args, config))
    except UsageError as exc:
        return flags.fail(PROG, exc)


# ----------------------------------------------------------------------------------------------------
# 1. flags and 2. cluster configuration


def validate_flags(args: argparse.Namespace) -> None:
    """What argparse types cannot check one flag at a time."""
    if args.leader_elect:
        if args.lease_duration <= args.renew_deadline:
            raise UsageError(
                f"--lease-duration ({args.lease_duration:g}) must be greater than --renew-deadline"
                f" ({args.renew_deadline:g}): a leader must give up before a standby may take over"
            )
        if args.renew_deadline <= LEASE_JITTER_FACTOR * args.retry_period:
            raise UsageError(
                f"--renew-deadline ({args.renew_deadline:g}) must be greater than {LEASE_JITTER_FACTOR:g} x"
                f" --retry-period ({args.retry_period:g}): a renewal needs room for more than one attempt"
            )


def load_cluster_config(args: argparse.Namespace) -> ClusterConfig:
    return flags.cluster_config(args.kubeconfig)


# ----------------------------------------------------------------------------------------------------
# 3. runtime


@dataclass
class OperatorRuntime:
    """What `build_runtime` started; everything is closed by the exit stack it was built on."""

    config: ClusterConfig
    client: KubeClient
    event_client: KubeClient
    manager: Manager
    metrics: OperatorMetrics
    tracer: RolloutTracer
    identity: str
    stack: contextlib.AsyncExitStack


async def _main(args: argparse.Namespace, config: ClusterConfig) -> int:
    async with contextlib.AsyncExitStack() as stack:
        runtime = await build_runtime(args, config, stack)
        return await run_operator(args, runtime)


async def build_runtime(
    args: argparse.Namespace, config: ClusterConfig, stack: contextlib.AsyncExitStack
) -> OperatorRuntime:
    from nodewright.controller.manager import LeaderElectionConfig, Manager
    from nodewright.kube.client import KubeClient
    from nodewright.observability.endpoints import parse_bind_address
    from nodewright.observability.heap import HeapTrimmer, glibc
    from nodewright.observability.loop_lag import EventLoopLagMonitor
    from nodewright.observability.metrics import OperatorMetrics
    from nodewright.observability.server import start_metrics_server
    from nodewright.observability.tracing import RolloutTracer

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
    stack.push_async_callback(asyncio.to_thread, metrics.shutdown)
    tracer = RolloutTracer.from_environment(service_instance=identity)
    stack.push_async_callback(tracer.aclose)
    client = KubeClient(config, qps=args.qps, burst=args.burst, metrics=metrics.requests)
    stack.push_async_callback(client.close)
    # Events get their own client and rate limit: a burst of events must not delay state transitions.
    event_client = KubeClient(
        config, qps=args.event_qps, burst=max(1, int(args.event_qps * 2)), metrics=metrics.requests
    )
    stack.push_async_callback(event_client.close)
    manager = Manager(
        client,
        leader_election=election,
        health_bind_address=args.health_probe_bind_address,
        # A leader-elected replica that cannot list restarts (a standby may be healthier); a single
        # replica keeps waiting: it must never exit over an outage.
        sync_timeout=300.0 if election else None,
        drain_timeout=args.drain_timeout,
        watch_metrics=metrics.watches,
        workqueue_metrics=metrics.workqueues,
        leader_metrics=metrics.leader,
        reconcile_metrics=metrics,
        lease_name=args.lease_name,
    )
    bind = parse_bind_address(args.metrics_bind_address)
    if bind is not None:
        try:
            metrics_server = await start_metrics_server(metrics, *bind)
        except OSError as exc:
            raise flags.listen_failure("--metrics-bind-address", args.metrics_bind_address, exc) from None
        stack.push_async_callback(metrics_server.stop)
    stack.push_async_callback(manager.health.stop)
    try:
        await manager.start_probes()
    except OSError as exc:
        raise flags.listen_failure(
            "--health-probe-bind-address", args.health_probe_bind_address, exc
        ) from None
    lag = EventLoopLagMonitor(metrics, interval=0.5)
    lag.start()
    stack.push_async_callback(lag.stop)
    trimmer = HeapTrimmer(glibc())
    trimmer.start()
    stack.push_async_callback(trimmer.stop)
    return OperatorRuntime(config, client, event_client, manager, metrics, tracer, identity, stack)


# ----------------------------------------------------------------------------------------------------
# 4. start-up checks and the run


async def run_operator(args: argparse.Namespace, rt: OperatorRuntime) -> int:
    import structlog

    from nodewright.api import constants
    from nodewright.controller.notify import parse_cluster_sink
    from nodewright.controller.operator import Operator, load_signing_key
    from nodewright.controller.signing import SIGNING_SECRET_NAME, PodSigner

    log = structlog.get_logger("nodewright.operator")
    namespace = args.namespace
    secret = f"Secret {namespace}/{SIGNING_SECRET_NAME}"
    api = f"/apis/{constants.GROUP}/{constants.VERSION}"

    async def setup() -> None:
        await _checked(
            rt,
            "GET /version",
            lambda: rt.client.get_text("/version", timeout=PROBE_TIMEOUT),
            not_found=f"{rt.config.server} answered 404 for /version: it is not a Kubernetes API server",
        )
        served = await _checked(
            rt,
            f"GET {api}",
            lambda: rt.client.get_text(api, timeout=PROBE_TIMEOUT),
            not_found=(
                f"API server {rt.config.server} does not serve {constants.GROUP}/{constants.VERSION}:"
                " install the CRDs (kubectl apply --server-side -f manifests/crds/) or the Helm chart"
            ),
        )
        missing = missing_resources(served)
        if missing:
            raise UsageError(
                f"API server {rt.config.server} does not serve {', '.join(missing)} ({constants.GROUP}):"
                " upgrade the CRDs (kubectl apply --server-side -f manifests/crds/, or helm upgrade)"
            )
        try:
            key = await _checked(
                rt, f"pod-signing key ({secret})", lambda: load_signing_key(rt.client, namespace)
            )
        except (KeyError, TypeError, ValueError):
            raise UsageError(
                f"{secret} has no base64 data.key: restore it, or delete it to have a new key generated"
            ) from None
        try:
            cluster_sink = parse_cluster_sink(args.notify_url_secret, args.notify_format, args.notify_events)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        operator = Operator(
            rt.manager,
            options=options_from(args),
            metrics=rt.metrics,
            tracer=rt.tracer,
            signer=PodSigner(key),
            workers=args.workers,
            node_workers=args.node_workers,
            instance=rt.identity,
            event_client=rt.event_client,
            cluster_sink=cluster_sink,
        )
        rt.stack.push_async_callback(operator.rt.events.close)
        rt.stack.push_async_callback(operator.notifier.close)
        log.info(
            "starting operator",
            server=rt.config.server,
            namespace=namespace,
            leader_elect=args.leader_elect,
            identity=rt.identity,
        )

    return await rt.manager.run(setup=setup)


def missing_resources(discovery: str) -> list[str]:
    """The resources of our group the operator watches that a discovery document does not list."""
    import json

    from nodewright.api import constants

    wanted = (constants.PLURAL_NODEWRIGHT, constants.PLURAL_POLICY, constants.PLURAL_BUDGET)
    try:
        doc = json.loads(discovery)
        if not isinstance(doc, dict) or doc.get("kind") != "APIResourceList":
            return []  # not a discovery document: the informers report what is wrong
        listed = {str(r.get("name")) for r in doc.get("resources") or []}
    except (ValueError, AttributeError):
        return []
    return [name for name in wanted if name not in listed]


async def _checked(
    rt: OperatorRuntime, what: str, call: Callable[[], Any], *, not_found: str | None = None
) -> Any:
    """`call` through `Manager.until_reachable`, with answers retrying cannot fix turned into a
    `UsageError` that says what to do (`not_found`: the story of a 404)."""
    from nodewright.kube.config import ConfigError
    from nodewright.kube.resources import ApiError

    try:
        return await rt.manager.until_reachable(call, what=what)
    except ConfigError as exc:
        raise UsageError(f"{rt.config.source}: {exc}") from None
    except ApiError as exc:
        raise UsageError(explain_api_error(exc, what=what, config=rt.config, not_found=not_found)) from None
    except Exception as exc:
        message = explain_transport_error(exc, config=rt.config)
        if message is None:
            raise
        raise UsageError(message) from None


def explain_api_error(
    exc: ApiError, *, what: str, config: ClusterConfig, not_found: str | None = None
) -> str:
    """The one-line story of an API answer at start-up that waiting will not change."""
    body = exc.body if isinstance(exc.body, dict) else {}
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    message = flags.one_line(exc.message or exc.reason)
    if exc.status == 401:
        return (
            f"API server {config.server} rejected the credentials of {config.source} (401 Unauthorized):"
            " give a valid token or client certificate"
        )
    if exc.status == 403:
        return (
            f"{what}: forbidden (403: {message}); grant the operator's ServiceAccount the RBAC in"
            " helm/nodewright/templates/operator-rbac.yaml (docs/security.md)"
        )
    if exc.status == 404 and details.get("kind") == "namespaces":
        namespace = details.get("name") or "?"
        return (
            f"namespace {namespace!r} does not exist: create it (kubectl create namespace {namespace})"
            " or pass --namespace with the operator's namespace"
        )
    if exc.status == 404 and not_found is not None:
        return not_found
    return f"{what}: {exc.status} {exc.reason}: {message}"


def explain_transport_error(exc: BaseException, *, config: ClusterConfig) -> str | None:
    """A message for TLS failures that are configuration errors; None for anything else."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return (
            f"API server {config.server}: its TLS certificate does not verify against the CA of"
            f" {config.source} ({flags.one_line(exc.certificate_error)}); fix certificate-authority(-data)"
            " or tls-server-name"
        )
    return None
