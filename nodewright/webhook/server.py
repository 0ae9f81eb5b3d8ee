"""Admission webhook server (AdmissionReview v1) for NodeWright and DeploymentPolicy, on aiohttp over HTTPS.

Endpoints:
- `/validate-nodewright`: CREATE/UPDATE. Schema, CEL mirror and semantic rules (`nodewright.api.validation`)
  plus cluster facts: the referenced DeploymentPolicy exists; on UPDATE, packages with uninstall.enabled
  may only be removed or downgraded once no node has them any more. Host settings two packages would
  fight over (this NodeWright's, or another's on the same nodes) are warnings (`webhook.conflicts`).
- `/validate-deploymentpolicy`: CREATE/UPDATE rules, and DELETE refused while NodeWrights reference the
  policy (the error names them). Only the webhook can protect DELETE: no schema rule sees deletions.
- `/mutate-nodewright`: sets each package's `name` from its map key (CRD defaults cannot read map keys).
- `/mutate-deploymentpolicy`: fills strategy parameter defaults that are missing. The CRD schema already
  defaults them when the strategy object exists, so this is normally a no-op; it keeps objects complete
  when they were stored before the defaults existed.

All problems of an object are returned at once in `status.message`, one `path: message` per entry;
warnings go to `response.warnings` and are printed by kubectl.

Malformed input never produces a 5xx: a body that is not JSON, or not an AdmissionReview with a
`request` object, gets HTTP 400 with a denied AdmissionReview naming the offending field
(`request.object`, ...); an object of the wrong shape (`spec: "x"`, `spec.packages: []`, numbers for
strings, no metadata) is denied with code 422 and the field path, by the mutating endpoints too (they
refuse only shapes they cannot patch, which the API server's schema refuses anyway). Only a bug in the
handlers answers 500, and the admission fuzzer (tests/admission_fuzz.py) keeps that from happening.
 Lookups go through `AdmissionFacts`; the
Kubernetes implementation bounds every request with a timeout shorter than the webhook's own
`timeoutSeconds`, and a failed lookup fails *open* for existence checks (with a warning) because the
operator re-checks at reconcile time, while the uninstall protection fails *closed*.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web

from nodewright.api import constants, validation
from nodewright.kube.config import load_pem_chain
from nodewright.webhook.conflicts import host_setting_warnings

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


OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


@dataclass
class _Review:
    uid: str
    operation: str
    obj: Any
    old: dict[str, Any] | None
    name: str


class MalformedReview(ValueError):
    """The body is not an AdmissionReview the handlers can answer; `errors` name the fields."""

    def __init__(self, uid: str, errors: list[validation.FieldError]) -> None:
        super().__init__(validation.format_errors(errors))
        self.uid = uid
        self.errors = errors


def _parse(body: Any) -> _Review:
    if not isinstance(body, Mapping):
        raise MalformedReview("", [validation.FieldError("<body>", "must be an AdmissionReview object")])
    req = body.get("request")
    if not isinstance(req, Mapping):
        raise MalformedReview("", [validation.FieldError("request", "must be an AdmissionRequest object")])
    uid = req.get("uid", "")
    errors: list[validation.FieldError] = []
    if not isinstance(uid, str):
        errors.append(validation.FieldError("request.uid", "must be a string"))
        uid = ""
    operation = req.get("operation")
    if operation not in OPERATIONS:
        errors.append(validation.FieldError("request.operation", f"must be one of {', '.join(OPERATIONS)}"))
    obj = req.get("object")
    if operation in ("CREATE", "UPDATE") and obj is None:
        errors.append(validation.FieldError("request.object", f"required for {operation}"))
    old = req.get("oldObject")
    if operation in ("UPDATE", "DELETE") and old is not None and not isinstance(old, dict):
        errors.append(validation.FieldError("request.oldObject", "must be an object"))
    if errors:
        raise MalformedReview(uid, errors)
    name = req.get("name")
    if not isinstance(name, str) or not name:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        meta_name = meta.get("name") if isinstance(meta, Mapping) else None
        name = meta_name if isinstance(meta_name, str) else ""
    return _Review(
        uid=uid,
        operation=str(operation),
        obj=obj,
        old=old if isinstance(old, dict) else None,
        name=name,
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

    def __init__(self, facts: AdmissionFacts, *, gate_secrets: frozenset[str] | None = None) -> None:
        self._facts = facts
        # The Secrets the chart lets the operator read for health gates (None: not told, not checked).
        self._gate_secrets = gate_secrets

    async def validate_nodewright(self, body: Any) -> dict[str, Any]:
        review = _parse(body)
        if review.operation not in ("CREATE", "UPDATE"):
            return _response(review.uid, allowed=True)
        warnings: list[str] = []
        spec = review.obj.get("spec") if isinstance(review.obj, Mapping) else None
        policy = spec.get("deploymentPolicy") if isinstance(spec, Mapping) else None
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
        warnings += await host_setting_warnings(review.obj, review.old, self._facts)
        return _response(review.uid, allowed=True, warnings=warnings)

    async def validate_deploymentpolicy(self, body: Any) -> dict[str, Any]:
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
        result = validation.validate_deploymentpolicy(
            review.obj, old=review.old, gate_secrets=self._gate_secrets
        )
        if result.errors:
            return _deny(review.uid, result.errors, result.warnings, "DeploymentPolicy", review.name)
        return _response(review.uid, allowed=True, warnings=result.warnings)

    async def mutate_nodewright(self, body: Any) -> dict[str, Any]:
        review = _parse(body)
        if review.operation not in ("CREATE", "UPDATE"):
            return _response(review.uid, allowed=True)
        if errors := validation.mutation_shape_errors(constants.KIND_NODEWRIGHT, review.obj):
            return _deny(review.uid, errors, [], "NodeWright", review.name)
        return _response(review.uid, allowed=True, patch=validation.package_name_patch(review.obj))

    async def mutate_deploymentpolicy(self, body: Any) -> dict[str, Any]:
        review = _parse(body)
        if review.operation not in ("CREATE", "UPDATE"):
            return _response(review.uid, allowed=True)
        if errors := validation.mutation_shape_errors(constants.KIND_POLICY, review.obj):
            return _deny(review.uid, errors, [], "DeploymentPolicy", review.name)
        return _response(review.uid, allowed=True, patch=validation.strategy_defaults_patch(review.obj))


def _uid_of(body: Any) -> str:
    req = body.get("request") if isinstance(body, Mapping) else None
    uid = req.get("uid") if isinstance(req, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _malformed(exc: MalformedReview) -> web.Response:
    lines = "\n".join(f"* {e}" for e in exc.errors)
    out = _response(exc.uid, allowed=False, code=400, message=f"malformed AdmissionReview:\n{lines}")
    out["response"]["status"]["reason"] = "BadRequest"
    return web.json_response(out, status=400)


def build_app(facts: AdmissionFacts, *, gate_secrets: frozenset[str] | None = None) -> web.Application:
    handlers = Handlers(facts, gate_secrets=gate_secrets)
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
                body = json.loads(await request.read())
            except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested beyond reason
                return _malformed(MalformedReview("", [validation.FieldError("<body>", "is not JSON")]))
            try:
                out = await handler(body)
            except MalformedReview as exc:
                return _malformed(exc)
            except Exception as exc:  # a bug must answer, not hang the API server until its timeout
                log.exception("admission handler failed", path=request.path)
                uid = _uid_of(body)
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
    gate_secrets: frozenset[str] | None = None,
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `await runner.cleanup()` to stop) and the bound port.

    `port=0` picks a free port (used by the e2e tests). `gate_secrets`: `Handlers`.
    """
    app = build_app(facts, gate_secrets=gate_secrets)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
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
    """TLS context from PEM bytes (`load_pem_chain`: in memory, no temporary directory needed on Linux)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pem_chain(ctx, cert_pem, key_pem)
    return ctx
