"""Admission webhook server (AdmissionReview v1) for NodeWright and DeploymentPolicy, on aiohttp over HTTPS.

Endpoints:
- `/validate-nodewright`: CREATE/UPDATE. Schema, CEL mirror and semantic rules (`nodewright.api.validation`)
  plus cluster facts: the referenced DeploymentPolicy exists; on UPDATE, packages with uninstall.enabled
  may only be removed or downgraded once no node has them any more.
- `/validate-deploymentpolicy`: CREATE/UPDATE rules, and DELETE refused while NodeWrights reference the
  policy (the error names them). Only the webhook can protect DELETE: no schema rule sees deletions.
- `/mutate-nodewright`: sets each package's `name` from its map key (CRD defaults cannot read map keys).
- `/mutate-deploymentpolicy`: fills strategy parameter defaults that are missing. The CRD schema already
  defaults them when the strategy object exists, so this is normally a no-op; it keeps objects complete
  when they were stored before the defaults existed.

All problems of an object are returned at once in `status.message`, one `path: message` per entry;
warnings go to `response.warnings` and are printed by kubectl. Lookups go through `AdmissionFacts`; the
Kubernetes implementation bounds every request with a timeout shorter than the webhook's own
`timeoutSeconds`, and a failed lookup fails *open* for existence checks (with a warning) because the
operator re-checks at reconcile time, while the uninstall protection fails *closed*.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web

from nodewright.api import validation

log = structlog.get_logger(__name__)

PATHS = {
    "validate-nodewright": "/validate-nodewright",
    "validate-deploymentpolicy": "/validate-deploymentpolicy",
    "mutate-nodewright": "/mutate-nodewright",
    "mutate-deploymentpolicy": "/mutate-deploymentpolicy",
}


class LookupError_(RuntimeError):
    """A cluster lookup failed (timeout, API error)."""


class AdmissionFacts(Protocol):
    """Cluster facts the admission rules need."""

    async def policy_exists(self, name: str) -> bool: ...

    async def nodewrights_using_policy(self, name: str) -> list[str]: ...

    async def package_present(self, nodewright: str, package: str) -> bool: ...


@dataclass
class _Review:
    uid: str
    operation: str
    obj: dict[str, Any]
    old: dict[str, Any] | None
    name: str


def _parse(body: Mapping[str, Any]) -> _Review:
    req = body.get("request") or {}
    obj = req.get("object") or {}
    old = req.get("oldObject")
    return _Review(
        uid=str(req.get("uid", "")),
        operation=str(req.get("operation", "")),
        obj=obj if isinstance(obj, dict) else {},
        old=old if isinstance(old, dict) else None,
        name=str(req.get("name") or (obj or {}).get("metadata", {}).get("name") or ""),
    )


def _response(
    uid: str,
    *,
    allowed: bool,
    message: str = "",
    warnings: list[str] | None = None,
    patch: list[dict[str, Any]] | None = None,
    code: int = 422,
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code, "message": message, "reason": "Invalid"}
    if warnings:
        # kubectl prints each warning; the API server limits them to 120 entries of 4 KiB.
        response["warnings"] = [w[:4000] for w in warnings[:100]]
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _deny(
    uid: str, errors: list[validation.FieldError], warnings: list[str], kind: str, name: str
) -> dict[str, Any]:
    lines = "\n".join(f"* {e}" for e in errors)
    return _response(uid, allowed=False, message=f"{kind} {name!r} is invalid:\n{lines}", warnings=warnings)


class Handlers:
    """Admission logic, independent of the transport (unit-testable with plain dicts)."""

    def __init__(self, facts: AdmissionFacts) -> None:
        self._facts = facts

    async def validate_nodewright(self, body: Mapping[str, Any]) -> dict[str, Any]:
        review = _parse(body)
        if review.operation not in ("CREATE", "UPDATE"):
            return _response(review.uid, allowed=True)
        warnings: list[str] = []
        policy = (review.obj.get("spec") or {}).get("deploymentPolicy")
        policies: dict[str, bool] = {}
        if isinstance(policy, str) and policy:
            try:
                policies[policy] = await self._facts.policy_exists(policy)
            except LookupError_ as exc:
                warnings.append(f"spec.deploymentPolicy: could not check that {policy!r} exists ({exc})")
        presence: dict[str, bool] = {}
        for pkg in validation.packages_needing_presence(review.obj, review.old):
            try:
                presence[pkg] = await self._facts.package_present(review.name, pkg)
            except LookupError_ as exc:
                # Fail closed: allowing the removal could strand an installed package with no uninstall.
                presence[pkg] = True
                warnings.append(
                    f"spec.packages[{pkg}]: could not read node state ({exc}); assuming installed"
                )
        result = validation.validate_nodewright(
            review.obj,
            old=review.old if review.operation == "UPDATE" else None,
            policy_exists=(lambda n: policies.get(n, True)),
            presence=lambda _nw, pkg: presence.get(pkg, True),
        )
        warnings = [*result.warnings, *warnings]
        if result.errors:
            return _deny(review.uid, result.errors, warnings, "NodeWright", review.name)
        return _response(review.uid, allowed=True, warnings=warnings)

    async def validate_deploymentpolicy(self, body: Mapping[str, Any]) -> dict[str, Any]:
        review = _parse(body)
        if review.operation == "DELETE":
            try:
                users = await self._facts.nodewrights_using_policy(review.name)
            except LookupError_ as exc:
                return _response(
                    review.uid,
                    allowed=False,
                    code=503,
                    message=f"cannot check which NodeWrights use DeploymentPolicy {review.name!r}"
                    f" ({exc}); retry",
                )
            if users:
                return _response(
                    review.uid,
                    allowed=False,
                    code=409,
                    message=f"DeploymentPolicy {review.name!r} is used by NodeWright(s)"
                    f" {', '.join(sorted(users))}:"
                    " change or delete their spec.deploymentPolicy first",
                )
            return _response(review.uid, allowed=True)
        if review.operation not in ("CREATE", "UPDATE"):
            return _response(review.uid, allowed=True)
        result = validation.validate_deploymentpolicy(review.obj, old=review.old)
        if result.errors:
            return _deny(review.uid, result.errors, result.warnings, "DeploymentPolicy", review.name)
        return _response(review.uid, allowed=True, warnings=result.warnings)

    async def mutate_nodewright(self, body: Mapping[str, Any]) -> dict[str, Any]:
        review = _parse(body)
        return _response(review.uid, allowed=True, patch=validation.package_name_patch(review.obj))

    async def mutate_deploymentpolicy(self, body: Mapping[str, Any]) -> dict[str, Any]:
        review = _parse(body)
        return _response(review.uid, allowed=True, patch=validation.strategy_defaults_patch(review.obj))


def build_app(facts: AdmissionFacts) -> web.Application:
    handlers = Handlers(facts)
    routes = {
        PATHS["validate-nodewright"]: handlers.validate_nodewright,
        PATHS["validate-deploymentpolicy"]: handlers.validate_deploymentpolicy,
        PATHS["mutate-nodewright"]: handlers.mutate_nodewright,
        PATHS["mutate-deploymentpolicy"]: handlers.mutate_deploymentpolicy,
    }
    app = web.Application(client_max_size=8 * 1024 * 1024)

    def endpoint(handler: Any) -> Any:
        async def serve(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return web.json_response({"error": "body is not an AdmissionReview"}, status=400)
            uid = str((body.get("request") or {}).get("uid", ""))
            try:
                out = await handler(body)
            except Exception as exc:  # a bug must answer, not hang the API server until its timeout
                log.exception("admission handler failed", path=request.path)
                out = _response(uid, allowed=False, code=500, message=f"internal webhook error: {exc}")
            return web.json_response(out)

        return serve

    for path, handler in routes.items():
        app.router.add_post(path, endpoint(handler))

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    return app


async def start_webhook_server(
    facts: AdmissionFacts,
    *,
    ssl_context: ssl.SSLContext,
    host: str = "0.0.0.0",
    port: int = 9443,
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `await runner.cleanup()` to stop) and the bound port.

    `port=0` picks a free port (used by the e2e tests).
    """
    runner = web.AppRunner(build_app(facts), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    server: Any = site._server  # aiohttp exposes the bound sockets only here
    bound = port
    if server is not None and getattr(server, "sockets", None):
        bound = int(server.sockets[0].getsockname()[1])
    log.info("webhook listening", host=host, port=bound)
    return runner, bound


def server_ssl_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """TLS context from PEM bytes (written to a private temp dir: `ssl` only loads from files)."""
    import tempfile
    from pathlib import Path

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


async def wait_forever(stop: asyncio.Event) -> None:
    await stop.wait()
