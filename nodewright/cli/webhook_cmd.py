"""`nodewright webhook`: run the admission webhook server.

Certificates come either from `--cert-dir` (tls.crt/tls.key, e.g. mounted by cert-manager) or, by
default, from the Secret managed by `nodewright.webhook.certs.CertManager`, which also keeps the
caBundle of the webhook configurations current and rotates the pair before expiry (the server reloads
the new pair without restarting: new TLS handshakes use it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("webhook", help="run the admission webhook (validation and defaulting)")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig (default: in-cluster)")
    parser.add_argument("--bind-address", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=9443, help="HTTPS port")
    parser.add_argument("--cert-dir", type=Path, default=None, help="use tls.crt/tls.key from this directory")
    parser.add_argument(
        "--namespace", default="nodewright-system", help="operator namespace (Secret lives here)"
    )
    parser.add_argument("--secret-name", default="nodewright-webhook-tls", help="Secret holding CA and cert")
    parser.add_argument(
        "--service-name", default="nodewright-webhook", help="Service name (certificate SANs)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from kubernetes_asyncio import client, config

    from nodewright.webhook import certs, configs
    from nodewright.webhook.facts import KubeFacts
    from nodewright.webhook.server import server_ssl_context, start_webhook_server

    if args.kubeconfig:
        await config.load_kube_config(config_file=str(args.kubeconfig))
    else:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    async with client.ApiClient() as api:
        manager: certs.CertManager | None = None
        if args.cert_dir:
            ctx = server_ssl_context(
                (args.cert_dir / "tls.crt").read_bytes(), (args.cert_dir / "tls.key").read_bytes()
            )
        else:
            manager = certs.CertManager(
                api,
                namespace=args.namespace,
                secret_name=args.secret_name,
                dns_names=certs.service_dns_names(args.service_name, args.namespace),
                validating_config=configs.VALIDATING_NAME,
                mutating_config=configs.MUTATING_NAME,
            )
            bundle = await manager.ensure()
            ctx = server_ssl_context(bundle.cert, bundle.key)
        runner, _port = await start_webhook_server(
            KubeFacts(api), ssl_context=ctx, host=args.bind_address, port=args.port
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        rotate: asyncio.Task[None] | None = None
        if manager is not None:

            def reload(b: certs.CertBundle) -> None:
                # load_cert_chain on the live context: later TLS handshakes present the new pair.
                _reload_chain(ctx, b.cert, b.key)

            rotate = asyncio.create_task(manager.run(reload))
        try:
            await stop.wait()
        finally:
            if rotate is not None:
                rotate.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rotate
            await runner.cleanup()
    return 0


def _reload_chain(ctx: Any, cert: bytes, key: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        c, k = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        c.write_bytes(cert)
        k.touch(mode=0o600)
        k.write_bytes(key)
        ctx.load_cert_chain(c, k)
