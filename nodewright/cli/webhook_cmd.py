"""`nodewright webhook`: run the admission webhook server.

Certificates come either from `--cert-dir` (tls.crt/tls.key, e.g. mounted by cert-manager) or, by
default, from the Secret managed by `nodewright.webhook.certs.CertManager`, which also keeps the
caBundle of the webhook configurations current and rotates the pair before expiry (the server reloads
the new pair without restarting: new TLS handshakes use it).

Start-up, in order, so that what is wrong is reported before anything waits:

1. flags are checked by argparse types (`nodewright.cli.flags`);
2. `--cert-dir` must hold a readable PEM certificate and matching key (tls.crt, tls.key);
3. the kubeconfig (or in-cluster service account) must load, CA and client certificate included;
4. `--bind-address`:`--port` must be free: checked at once, so a port in use is reported before any
   wait; the server itself listens only once it has a certificate (the chart's readiness probe is
   the open port);
5. managed mode only: the webhook configurations must exist (they receive the caBundle) and the
   Secret is loaded or created in `--namespace` (which must exist). While the API server is
   unreachable this step waits with jittered exponential backoff, one log line per attempt.

Each failure that retrying cannot fix is one line on stderr naming the flag or object and what to do,
with exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodewright.cli import flags
from nodewright.cli.flags import UsageError

if TYPE_CHECKING:
    from nodewright.kube.client import KubeClient
    from nodewright.kube.config import ClusterConfig
    from nodewright.kube.resources import ApiError

PROG = "nodewright webhook"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("webhook", help="run the admission webhook (validation and defaulting)")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig (default: in-cluster)")
    parser.add_argument(
        "--bind-address", type=flags.host_address, default="0.0.0.0", help="address to listen on"
    )
    parser.add_argument("--port", type=flags.port_number, default=9443, help="HTTPS port")
    parser.add_argument("--cert-dir", type=Path, default=None, help="use tls.crt/tls.key from this directory")
    parser.add_argument(
        "--namespace",
        type=flags.dns_label,
        default="nodewright-system",
        help="operator namespace (Secret lives here)",
    )
    parser.add_argument(
        "--secret-name",
        type=flags.dns_subdomain,
        default="nodewright-webhook-tls",
        help="Secret holding CA and cert",
    )
    parser.add_argument(
        "--service-name",
        type=flags.dns_1035_label,
        default="nodewright-webhook",
        help="Service name (certificate SANs)",
    )
    parser.add_argument(
        "--cert-host",
        action="append",
        type=_cert_host,
        default=[],
        metavar="NAME_OR_IP",
        help="another DNS name or IP address for the managed serving certificate (repeatable), for an API"
        " server that reaches the webhook by URL instead of through the Service",
    )
    parser.add_argument(
        "--gate-secret-names",
        type=_secret_names,
        default=None,
        metavar="NAME[,NAME...]",
        help="the Secrets (operator namespace) the operator may read for health gates, as the chart's"
        " healthGates.secretNames (empty: none); a DeploymentPolicy whose Prometheus gate names another"
        " is refused. Unset: not checked",
    )
    parser.set_defaults(func=run)


def _secret_names(text: str) -> frozenset[str]:
    return frozenset(flags.dns_subdomain(n.strip()) for n in text.split(",") if n.strip())


def run(args: argparse.Namespace) -> int:
    from nodewright.kube.config import NoTempDir
    from nodewright.observability.logging import configure_logging

    configure_logging("info")  # JSON on stderr unless stderr is a terminal, like the operator
    try:
        return asyncio.run(_serve(args))
    except (UsageError, NoTempDir) as exc:
        return flags.fail(PROG, exc)


def load_cert_dir(directory: Path) -> tuple[bytes, bytes]:
    """tls.crt and tls.key from `--cert-dir`, checked to be a certificate and its key."""
    from nodewright.webhook.server import server_ssl_context

    pair = []
    for name in ("tls.crt", "tls.key"):
        try:
            pair.append((directory / name).read_bytes())
        except OSError as exc:
            raise UsageError(
                f"--cert-dir {directory}: cannot read {name} ({exc.strerror or exc}): mount the serving"
                " certificate there (tls.crt, tls.key), or omit --cert-dir to let the webhook manage one"
            ) from None
    try:
        server_ssl_context(pair[0], pair[1])
    except (ssl.SSLError, ValueError) as exc:
        raise UsageError(
            f"--cert-dir {directory}: tls.crt and tls.key are not a PEM certificate and its private key"
            f" ({flags.one_line(exc)})"
        ) from None
    return pair[0], pair[1]


def _load_kube_config(kubeconfig: Path | None) -> ClusterConfig:
    """The cluster settings (kubeconfig, else in-cluster), checked by the project's loader, which names
    the bad field."""
    from nodewright.kube.config import ConfigError, load_incluster, load_kubeconfig

    try:
        return load_kubeconfig(kubeconfig) if kubeconfig else load_incluster()
    except ConfigError as exc:
        hint = "" if kubeconfig else " (pass --kubeconfig, or run in a cluster)"
        raise UsageError(f"{exc}{hint}") from None


async def _serve(args: argparse.Namespace) -> int:
    from nodewright.webhook.facts import KubeFacts, webhook_client
    from nodewright.webhook.server import server_ssl_context, start_webhook_server

    served = load_cert_dir(args.cert_dir) if args.cert_dir else None
    config = _load_kube_config(args.kubeconfig)
    server = config.server
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with webhook_client(config) as api, contextlib.AsyncExitStack() as stack:
        cert_manager = None
        if served is None:
            # The port opens only with a certificate (the readiness probe is the open port), but a
            # taken port is reported now, not after waiting for the API server.
            flags.check_bindable("--port", args.bind_address, args.port)
            managed = await _managed_certificates(args, api, server, stop)
            if managed is None:
                return 0  # stopped while waiting for the API server
            bundle, cert_manager = managed
            served = (bundle.cert, bundle.key)
        ctx = server_ssl_context(*served)
        try:
            runner, _port = await start_webhook_server(
                KubeFacts(api),
                ssl_context=ctx,
                host=args.bind_address,
                port=args.port,
                gate_secrets=args.gate_secret_names,
            )
        except OSError as exc:
            raise flags.listen_failure("--port", f"{args.bind_address}:{args.port}", exc) from None
        stack.push_async_callback(runner.cleanup)
        if cert_manager is not None:

            def reload(b: Any) -> None:
                # load_cert_chain on the live context: later TLS handshakes present the new pair.
                _reload_chain(ctx, b.cert, b.key)

            rotate = asyncio.create_task(cert_manager.run(reload))

            async def stop_rotation() -> None:
                rotate.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rotate

            stack.push_async_callback(stop_rotation)
        await stop.wait()
    return 0


async def _managed_certificates(
    args: argparse.Namespace, api: KubeClient, server: str, stop: asyncio.Event
) -> tuple[Any, Any] | None:
    """Wait for the API server, check the configurations exist, load or create the serving pair."""
    import aiohttp

    from nodewright.controller.manager import until_reachable
    from nodewright.kube.resources import (
        MUTATINGWEBHOOKCONFIGURATIONS,
        VALIDATINGWEBHOOKCONFIGURATIONS,
        ApiError,
        NotFound,
    )
    from nodewright.webhook import certs, configs

    ips, names = _split_hosts(args.cert_host)
    manager = certs.CertManager(
        api,
        namespace=args.namespace,
        secret_name=args.secret_name,
        dns_names=[*certs.service_dns_names(args.service_name, args.namespace), *names],
        ip_addresses=ips,
        validating_config=configs.VALIDATING_NAME,
        mutating_config=configs.MUTATING_NAME,
    )

    async def start() -> certs.CertBundle:
        for resource, name in (
            (VALIDATINGWEBHOOKCONFIGURATIONS, configs.VALIDATING_NAME),
            (MUTATINGWEBHOOKCONFIGURATIONS, configs.MUTATING_NAME),
        ):
            try:
                await api.get(resource, name)
            except NotFound:
                raise UsageError(
                    f"{resource.kind} {name} not found: apply manifests/webhook/webhook-configurations.yaml"
                    " (or install the Helm chart), or serve your own certificate with --cert-dir"
                ) from None
        return await manager.ensure()

    work = asyncio.ensure_future(until_reachable(start, what="webhook certificate", server=server))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, stopped):
            task.cancel()
        await asyncio.gather(work, stopped, return_exceptions=True)
    if not work.done() or work.cancelled():
        return None
    try:
        return work.result(), manager
    except ApiError as exc:
        raise UsageError(_explain(exc, args)) from None
    except aiohttp.ClientConnectorCertificateError as exc:
        raise UsageError(
            f"API server {server}: its TLS certificate does not verify against the configured CA"
            f" ({flags.one_line(exc.certificate_error)}); check --kubeconfig"
        ) from None


def _cert_host(text: str) -> str:
    """A `--cert-host`: an IP address or a DNS name."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return flags.dns_subdomain(text)


def _split_hosts(hosts: list[str]) -> tuple[list[str], list[str]]:
    """`--cert-host` values as (IP addresses, DNS names)."""
    import ipaddress

    ips, names = [], []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            names.append(host)
    return ips, names


def _explain(exc: ApiError, args: argparse.Namespace) -> str:
    """One line for an API answer that retrying will not change."""
    body = exc.body if isinstance(exc.body, dict) else {}
    details = body.get("details")
    message = flags.one_line(exc.message or exc.reason)
    if exc.status == 404 and isinstance(details, dict) and details.get("kind") == "namespaces":
        return (
            f"namespace {args.namespace!r} does not exist: create it (kubectl create namespace"
            f" {args.namespace}) or pass --namespace with the operator's namespace"
        )
    if exc.status == 401:
        return "the API server rejected the webhook's credentials (401 Unauthorized): check --kubeconfig"
    if exc.status == 403:
        return (
            f"forbidden (403: {message}); grant the webhook's ServiceAccount the RBAC in"
            " helm/nodewright/templates/webhook-rbac.yaml (docs/security.md)"
        )
    return f"webhook certificate: {exc.status} {exc.reason}: {message}"


def _reload_chain(ctx: Any, cert: bytes, key: bytes) -> None:
    from nodewright.kube.config import load_pem_chain

    load_pem_chain(ctx, cert, key)
