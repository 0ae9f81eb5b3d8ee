"""Writes a NodeWright's revision history: one `apps/v1` ControllerRevision per kept spec.

What is kept and why is decided in `plan.revisions`; this module reads and writes the objects:

- where: the operator's namespace (a ControllerRevision is namespaced; a namespaced object may name a
  cluster-scoped owner, so each revision is owned by its NodeWright -- `controller: true`,
  `blockOwnerDeletion: true`, like the package pods and ConfigMaps -- and the garbage collector deletes
  them with it); labels `nodewright.io/managed-by=nodewright-operator`, `nodewright.io/nodewright=<nw>`;
  annotations with the NodeWright generation the revision was taken from and who changed the spec
  (`plan.revisions.last_spec_change`); `data: {spec: ...}`; `revision`: its number;
- when: the rollout controller calls `RevisionKeeper.observe` on every pass; it does something only for
  a generation this process has not recorded yet (after a start: once per NodeWright), with one LIST by
  label, then the writes `plan.revisions.sync` decided: create, a merge patch of `revision` and the
  annotations (with the read resourceVersion) for a spec that came back, and deletes with a uid
  precondition. A spec that lived only between two passes is not recorded (as with Deployments);
- failures never hold the rollout up: a refused or failed call is logged once per generation and the
  next pass tries again; the history the last successful sync left is what the Halted condition names.
  Another writer (a second operator during a leader hand-over) makes a create answer 409 or a patch
  409: the next pass lists again.

RBAC (chart Role in the release namespace): `controllerrevisions` list, create, patch, delete.
"""

from __future__ import annotations

import contextlib

import aiohttp
import structlog

from nodewright.api import constants
from nodewright.kube.client import KubeClient
from nodewright.kube.resources import CONTROLLERREVISIONS, JSON, ApiError, NotFound
from nodewright.plan import revisions as plan
from nodewright.plan.revisions import Revision

log = structlog.get_logger("nodewright.controller.revisions")


def _annotations(rev: Revision) -> dict[str, str | None]:
    change = rev.change
    return {
        plan.GENERATION_ANNOTATION: str(rev.generation) if rev.generation is not None else None,
        plan.CHANGED_BY_ANNOTATION: change.manager if change else None,
        plan.CHANGE_OPERATION_ANNOTATION: (change.operation or None) if change else None,
        plan.CHANGED_AT_ANNOTATION: (change.time or None) if change else None,
    }


def revision_object(nodewright: plan.Observed, rev: Revision, *, namespace: str) -> JSON:
    """The ControllerRevision of `rev`, owned by the NodeWright."""
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": rev.name,
            "namespace": namespace,
            "labels": {
                constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
                constants.POD_LABEL_NODEWRIGHT: nodewright.name,
            },
            "annotations": {k: v for k, v in _annotations(rev).items() if v is not None},
            "ownerReferences": [
                {
                    "apiVersion": constants.API_VERSION,
                    "kind": constants.KIND_NODEWRIGHT,
                    "name": nodewright.name,
                    "uid": nodewright.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"spec": dict(rev.spec)},
        "revision": rev.number,
    }


class RevisionKeeper:
    """Keeps each NodeWright's revisions in step with its spec (module docstring)."""

    def __init__(self, client: KubeClient, *, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._recorded: dict[str, tuple[str, int | None]] = {}  # NodeWright -> (uid, generation)
        self._history: dict[str, tuple[Revision, ...]] = {}
        self._warned: dict[str, tuple[str, int | None]] = {}

    def history(self, name: str) -> tuple[Revision, ...]:
        """The history as of the last successful sync (oldest first; empty: none yet)."""
        return self._history.get(name, ())

    def forget(self, name: str) -> None:
        for memory in (self._recorded, self._history, self._warned):
            memory.pop(name, None)

    async def observe(self, obj: JSON) -> tuple[Revision, ...]:
        """Record the NodeWright's spec as its newest revision if this generation is new here; the
        history (possibly from an earlier pass when the API refused this one)."""
        seen = plan.observed(obj)
        key = (seen.uid, seen.generation)
        if self._recorded.get(seen.name) == key:
            return self.history(seen.name)
        try:
            history = await self._sync(seen)
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            if self._warned.get(seen.name) != key:
                self._warned[seen.name] = key
                log.warning(
                    "revision history not recorded; retried on the next pass",
                    nodewright=seen.name,
                    generation=seen.generation,
                    error=str(exc)[:300],
                )
            return self.history(seen.name)
        self._recorded[seen.name] = key
        self._history[seen.name] = history
        return history

    async def _sync(self, seen: plan.Observed) -> tuple[Revision, ...]:
        listed = await self._client.list(
            CONTROLLERREVISIONS, namespace=self._namespace, label_selector=plan.revision_selector(seen.name)
        )
        ours: list[Revision] = []
        taken: list[str] = []
        for item in listed.items:
            rev = plan.parse_revision(item, owner_uid=seen.uid)
            if rev is None:
                taken.append(str((item.get("metadata") or {}).get("name") or ""))
            else:
                ours.append(rev)
        decided = plan.sync(seen, ours, taken=taken)
        if decided.create is not None:
            body = revision_object(seen, decided.create, namespace=self._namespace)
            await self._client.create(CONTROLLERREVISIONS, body, namespace=self._namespace)
        if decided.renumber is not None:
            await self._renumber(decided.renumber)
        for old in decided.delete:
            with contextlib.suppress(NotFound):
                await self._client.delete(
                    CONTROLLERREVISIONS, old.name, namespace=self._namespace, uid=old.uid
                )
        if decided.changes:
            log.info(
                "revision history recorded",
                nodewright=seen.name,
                generation=seen.generation,
                revision=decided.history[-1].number,
                created=decided.create.name if decided.create else None,
                renumbered=decided.renumber.name if decided.renumber else None,
                deleted=[r.name for r in decided.delete],
            )
        return decided.history

    async def _renumber(self, rev: Revision) -> None:
        """A spec that came back: its revision takes the next number (data is immutable; `revision` and
        the annotations are not), guarded by the resourceVersion it was read at."""
        patch = {
            "metadata": {"annotations": _annotations(rev), "resourceVersion": rev.resource_version},
            "revision": rev.number,
        }
        await self._client.patch(CONTROLLERREVISIONS, rev.name, patch, namespace=self._namespace)
