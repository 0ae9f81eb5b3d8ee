"""Which package pods the node controller believes, and what happens to the ones it does not.

A package pod runs privileged on a host with the host's root mounted, and its exit codes decide a node's
state. So the node controller reads a pod only after `PodSigner.check` (see `controller.signing` for
the signature, the seal and the threat model), and this module does the Kubernetes side of it:

- **Binding with the seal.** Stage and interrupt pods are created unbound (`plan.podspec`). Right
  after the operator creates one, the create response is checked against the manifest it sent: if the
  stored spec differs in anything the signature binds (an admission webhook mutated it), the pod is
  deleted at once and the creation fails like a pod the API server refused (`PodMutatedOnCreate`, a
  422: the stage fails through its attempts and the node ends `erroring` with the reason). Otherwise
  the uid is remembered (`PodExpectations`) and the pod is bound to its node through
  `pods/<name>/binding` with `metadata.uid` as a precondition and the seal as an annotation
  (kube-apiserver writes `nodeName` and the seal together, so the seal can never land on someone
  else's pod and nothing runs unsealed). A binding that failed (timeout, 5xx) or was cut off by an
  operator restart is done by a later reconcile: the planner asks for it (`BindPod`) while the pod's
  stage still expects it. A binding the API server refuses (403: RBAC without `pods/binding`) deletes
  the pod and fails the attempt like a refused create, naming the missing permission.
- **Untrusted pods.** A pod in the operator namespace with this NodeWright's package-pod label that
  fails verification -- forged, altered, copied to another node, re-created after deletion (new uid),
  signed by the previous scheme, or bound without our seal -- never becomes a `PodSummary`. It is
  reported once (a Warning Event `UntrustedPackagePod` on the node and on the NodeWright, naming the
  pod and the failed check; `nodewright_untrusted_pods_total{reason}`; a log line) and deleted with a
  uid precondition (so a legitimate pod that took the name meanwhile is never hit) and a 1-second
  grace period (the pod chose its own `terminationGracePeriodSeconds`; 0 would remove the API object
  before the kubelet has stopped the containers). If it had taken the name of one of our pods, the
  planner sees that pod as lost and creates it again once the name is free.
- A pod whose controller owner is another uid but that verifies is ours from an earlier NodeWright of
  the same name: it is left to the garbage collector, quietly.

`trusted()` is synchronous (it runs inside the pod scan); the writes it decides are queued and sent by
`flush()`, which the node controller awaits right after the scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.controller.runtime import Runtime
from nodewright.controller.signing import POD_ANNOTATION_SEAL, UNTRUSTED_EXPLANATIONS, UntrustedReason
from nodewright.kube.resources import JSON, ApiError, Conflict, NotFound
from nodewright.observability import events as catalogue
from nodewright.plan import podspec

log = structlog.get_logger("nodewright.controller.trust")

UNTRUSTED_DELETE_GRACE: Final = 1  # seconds; see the module docstring
MUTATED_REASON: Final = "MutatedOnCreate"


class BindRefused(ApiError):
    """The API server refused to bind a package pod to its node (403, 422, ...); see `PodTrust.adopt`."""


class PodMutatedOnCreate(ApiError):
    """The API server stored our pod with a different spec; raised by `PodTrust.adopt`.

    A 422, so the node controller handles it like any refused create: a failed attempt with this
    message, retried with backoff and finally `erroring` -- never a node stuck `in_progress`.
    """

    def __init__(self, message: str) -> None:
        super().__init__(422, MUTATED_REASON, message)


@dataclass(frozen=True, slots=True)
class _Untrusted:
    nodewright: str
    nodewright_uid: str | None
    namespace: str
    name: str
    uid: str
    node: str
    reason: UntrustedReason
    detail: str
    report: bool
    delete: bool


def is_drift_check(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(constants.POD_LABEL_PURPOSE) == constants.POD_PURPOSE_DRIFT_CHECK


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


class PodTrust:
    """Verification, sealing and removal of package pods for the node controller (module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._reported: set[str] = set()  # uids (or namespace/name) already reported
        self._untrusted: list[_Untrusted] = []

    # -- the pod scan -------------------------------------------------------------------------------

    def trusted(self, nw: NodeWright, pods: Iterable[JSON]) -> list[JSON]:
        """The pods of `pods` (already this NodeWright's by label) that are trusted and owned by `nw`."""
        out: list[JSON] = []
        owner_uid = nw.metadata.uid or ""
        expectations = self.rt.pod_expectations
        for pod in pods:
            meta = _meta(pod)
            uid = str(meta.get("uid") or "")
            verdict = self.rt.signer.check(pod, created_here=expectations.created_here(uid))
            owners = [o.get("uid") for o in meta.get("ownerReferences") or () if o.get("controller")]
            if verdict.reason is UntrustedReason.UNSEALED and is_drift_check(pod):
                # Drift checks are not sealed (one write less per check): one this process did not
                # create (an earlier operator's, cut off by a restart) is removed quietly and the node is
                # checked again; it never counts.
                self._distrust(nw, pod, verdict.reason, quiet=True)
                continue
            if verdict.reason is not None:
                self._distrust(nw, pod, verdict.reason)
                continue
            if owner_uid not in owners:
                continue  # ours, for an earlier NodeWright of this name: the garbage collector removes it
            out.append(pod)
        return out

    def _distrust(
        self, nw: NodeWright, pod: JSON, reason: UntrustedReason, detail: str = "", *, quiet: bool = False
    ) -> None:
        meta = _meta(pod)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        uid = str(meta.get("uid") or "")
        marker = uid or f"{namespace}/{name}"
        report = marker not in self._reported and not quiet
        self._reported.add(marker)
        terminating = bool(meta.get("deletionTimestamp"))
        delete = not terminating and not self.rt.pod_expectations.deletion_pending(uid)
        if report or delete:
            self._untrusted.append(
                _Untrusted(
                    nodewright=nw.metadata.name,
                    nodewright_uid=nw.metadata.uid,
                    namespace=namespace,
                    name=name,
                    uid=uid,
                    node=podspec.pod_node(pod),
                    reason=reason,
                    detail=detail,
                    report=report,
                    delete=delete,
                )
            )

    async def flush(self) -> None:
        """Report and delete what the scans found untrusted."""
        untrusted, self._untrusted = self._untrusted, []
        for item in untrusted:
            if item.report:
                await self._report(item)
            if item.delete:
                await self._delete(item)

    async def _report(self, item: _Untrusted) -> None:
        why = UNTRUSTED_EXPLANATIONS[item.reason] + (f" ({item.detail})" if item.detail else "")
        ref = f"{item.namespace}/{item.name}"
        log.warning(
            "untrusted package pod: deleting it",
            pod=ref,
            uid=item.uid,
            node=item.node,
            nodewright=item.nodewright,
            reason=item.reason.value,
            why=why,
        )
        self.rt.metrics.count_untrusted_pod(item.reason.value)
        spec = catalogue.untrusted_package_pod(item.nodewright, ref, item.node, why)
        node = self.rt.node(item.node) if item.node else None
        if item.node:
            await self.rt.events.record(
                kind="Node",
                name=item.node,
                uid=str(_meta(node).get("uid") or "") if node else None,
                reason=spec.reason.value,
                message=spec.message,
                event_type=spec.type.value,
                related=item.nodewright,
            )
        await self.rt.events.record(
            kind=constants.KIND_NODEWRIGHT,
            name=item.nodewright,
            uid=item.nodewright_uid,
            reason=spec.reason.value,
            message=spec.message,
            event_type=spec.type.value,
        )

    async def _delete(self, item: _Untrusted) -> None:
        try:
            gone = await self.rt.client.delete_pod(
                item.namespace, item.name, uid=item.uid or None, grace_period=UNTRUSTED_DELETE_GRACE
            )
        except ApiError as exc:
            # Retried by the next scan that sees the pod (the report is not repeated).
            log.warning(
                "untrusted package pod not deleted", pod=f"{item.namespace}/{item.name}", error=str(exc)
            )
            return
        if gone and item.uid:
            self.rt.pod_expectations.deleted(item.uid)

    # -- creation -----------------------------------------------------------------------------------

    async def adopt(self, created: JSON, manifest: JSON, *, nw: NodeWright) -> None:
        """`created` is the API server's answer to creating `manifest`: check it, remember it, bind it.

        Raises `PodMutatedOnCreate` (after deleting the pod) when what was stored is not what was
        signed, and `BindRefused` (after deleting the pod) when the API server refuses the binding.
        Pods created bound (drift checks) are only remembered.
        """
        verdict = self.rt.signer.check(created, created_here=True)
        digests = self.rt.signer.digests
        # Stored as built (the common answer, from digests already known): no walk over both run specs.
        stored_as_built = digests.digest(manifest) == digests.digest(created)
        changes = [] if stored_as_built else podspec.run_spec_changes(manifest, created)
        if changes or verdict.reason is not None:
            detail = (
                ", ".join(changes)
                if changes
                else UNTRUSTED_EXPLANATIONS[verdict.reason or UntrustedReason.UNSIGNED]
            )
            self._distrust(nw, created, UntrustedReason.MUTATED_ON_CREATE, f"changed: {detail}")
            await self.flush()
            raise PodMutatedOnCreate(
                f"pod {_meta(created).get('name')} was stored with a spec that differs from what the"
                f" operator built ({detail}); it was deleted. A mutating admission webhook is the usual"
                f" cause: exclude namespace {self.rt.options.namespace} from webhooks that mutate pods"
            )
        self.rt.pod_expectations.created(created)
        if verdict.bound:
            return
        try:
            await self.bind(created)
        except BindRefused:
            self.rt.pod_expectations.forget(created)
            meta = _meta(created)
            await self.rt.client.delete_pod(
                str(meta.get("namespace")), str(meta.get("name")), uid=str(meta.get("uid") or "") or None
            )
            raise

    async def bind(self, pod: JSON) -> bool:
        """Bind an unbound pod of ours to its node, sealed (uid-preconditioned); True when bound now.

        Transient failures are logged and left to the next reconcile (the pod stays unbound, so nothing
        ran); a refusal raises `BindRefused`.
        """
        meta = _meta(pod)
        name, namespace, uid = str(meta.get("name")), str(meta.get("namespace")), str(meta.get("uid") or "")
        node = podspec.pod_node(pod)
        seal = self.rt.signer.seal(pod)
        try:
            await self.rt.client.bind_pod(
                namespace, name, uid=uid, node=node, annotations={POD_ANNOTATION_SEAL: seal}
            )
        except NotFound:
            return False  # gone already
        except Conflict as exc:
            # Bound already (an earlier try whose answer was lost), or the name is another pod's now:
            # the watch shows which, and verification decides.
            log.info("package pod not bound", pod=f"{namespace}/{name}", uid=uid, error=str(exc))
            return False
        except ApiError as exc:
            if isinstance(exc.status, int) and 400 <= exc.status < 500 and exc.status not in (408, 429):
                raise BindRefused(
                    exc.status, exc.reason, _refused_message(namespace, name, node, exc)
                ) from exc
            log.warning("package pod not bound", pod=f"{namespace}/{name}", uid=uid, error=str(exc))
            return False
        except TimeoutError as exc:
            log.warning("package pod not bound", pod=f"{namespace}/{name}", uid=uid, error=repr(exc))
            return False
        bound = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
        bound["metadata"] = {
            **meta,
            "annotations": {**(meta.get("annotations") or {}), POD_ANNOTATION_SEAL: seal},
        }
        self.rt.pod_expectations.sealed(bound)
        log.debug("package pod bound", pod=f"{namespace}/{name}", node=node)
        return True


def _refused_message(namespace: str, name: str, node: str, exc: ApiError) -> str:
    hint = (
        " The operator's ServiceAccount needs `create` on `pods/binding` in its namespace (the chart's"
        " operator-rbac.yaml grants it)."
        if exc.status == 403
        else ""
    )
    return (
        f"binding pod {namespace}/{name} to node {node} was refused: {exc.message}.{hint}"
        " The pod was deleted."
    )
