"""Which package pods the node controller believes, and what happens to the ones it does not.

A package pod runs privileged on a host with the host's root mounted, and its exit codes decide a node's
state. So the node controller reads a pod only after `PodSigner.check` (see `controller.context` for
the signature, the seal and the threat model), and this module does the Kubernetes side of it:

- **Sealing.** Right after the operator creates a pod, the create response is checked against the
  manifest it sent: if the stored spec differs in anything the signature binds (an admission webhook
  mutated it), the pod is deleted at once and the creation fails like a pod the API server refused
  (`PodMutatedOnCreate`, a 422: the stage fails through its attempts and the node ends `erroring`
  with the reason). Otherwise the uid is remembered (`PodExpectations`) and the seal annotation is
  written with a merge patch that carries `metadata.uid` as a precondition (kube-apiserver answers
  422 "field is immutable" if a re-created pod took the name meanwhile, so the seal can never land on
  someone else's pod). A seal that could not be written is retried on later reconciles.
- **Untrusted pods.** A pod in the operator namespace with this NodeWright's package-pod label that
  fails verification -- forged, altered, copied to another node, re-created after deletion (new uid),
  signed by the previous scheme, or ours but never sealed -- never becomes a `PodSummary`. It is
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
from nodewright.controller.context import (
    POD_ANNOTATION_SEAL,
    UNTRUSTED_EXPLANATIONS,
    Runtime,
    UntrustedReason,
)
from nodewright.kube.resources import JSON, PODS, ApiError, NotFound
from nodewright.observability import events as catalogue
from nodewright.plan import podspec

log = structlog.get_logger("nodewright.controller.trust")

UNTRUSTED_DELETE_GRACE: Final = 1  # seconds; see the module docstring
MUTATED_REASON: Final = "MutatedOnCreate"


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


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


class PodTrust:
    """Verification, sealing and removal of package pods for the node controller (module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._reported: set[str] = set()  # uids (or namespace/name) already reported
        self._untrusted: list[_Untrusted] = []
        self._to_seal: list[JSON] = []

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
            if verdict.reason is not None:
                self._distrust(nw, pod, verdict.reason)
                continue
            if owner_uid not in owners:
                continue  # ours, for an earlier NodeWright of this name: the garbage collector removes it
            if not verdict.sealed and expectations.seal_pending(uid):
                self._to_seal.append(pod)
            out.append(pod)
        return out

    def _distrust(self, nw: NodeWright, pod: JSON, reason: UntrustedReason, detail: str = "") -> None:
        meta = _meta(pod)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        uid = str(meta.get("uid") or "")
        marker = uid or f"{namespace}/{name}"
        report = marker not in self._reported
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
                    node=str((pod.get("spec") or {}).get("nodeName") or ""),
                    reason=reason,
                    detail=detail,
                    report=report,
                    delete=delete,
                )
            )

    async def flush(self) -> None:
        """Report and delete what the scans found untrusted; write pending seals."""
        untrusted, self._untrusted = self._untrusted, []
        to_seal, self._to_seal = self._to_seal, []
        for item in untrusted:
            if item.report:
                await self._report(item)
            if item.delete:
                await self._delete(item)
        for pod in to_seal:
            if self.rt.pod_expectations.seal_pending(str(_meta(pod).get("uid") or "")):
                await self.seal(pod)

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
        """`created` is the API server's answer to creating `manifest`: check it, remember it, seal it.

        Raises `PodMutatedOnCreate` (after deleting the pod) when what was stored is not what was signed.
        """
        changes = podspec.run_spec_changes(manifest, created)
        verdict = self.rt.signer.check(created, created_here=True)
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
        await self.seal(created)

    async def seal(self, pod: JSON) -> None:
        """Write the seal of a pod this process created (uid-preconditioned); failures are retried later."""
        meta = _meta(pod)
        name, namespace, uid = str(meta.get("name")), str(meta.get("namespace")), str(meta.get("uid") or "")
        patch = {"metadata": {"uid": uid, "annotations": {POD_ANNOTATION_SEAL: self.rt.signer.seal(pod)}}}
        try:
            sealed = await self.rt.client.patch(PODS, name, patch, namespace=namespace)
        except NotFound:
            return  # gone already
        except ApiError as exc:
            # 422 (uid immutable): our pod was deleted and someone re-created the name; that pod is not
            # ours and fails verification on its own. Anything else: the next reconcile tries again.
            log.warning("package pod not sealed", pod=f"{namespace}/{name}", uid=uid, error=str(exc))
            return
        self.rt.pod_expectations.sealed(sealed)
