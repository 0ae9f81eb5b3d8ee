"""Revision history of a NodeWright: every accepted spec kept, so a rollout can be undone.

Kubernetes keeps the history of a Deployment, StatefulSet or DaemonSet in `apps/v1` ControllerRevision
objects: `data` holds the template, `revision` an int64, the object is owned by its workload
(`controller: true`, so the garbage collector removes it with the owner), named `<owner>-<hash>`. The
controller de-duplicates identical templates by hash, and when a spec comes back (a rollback, or the
same edit applied again) it gives the existing revision the next number instead of writing a copy;
`revisionHistoryLimit` (default 10) old revisions are kept besides the current one. NodeWright keeps
its specs the same way (the objects are written by `controller.revisions`; the decisions are here):

- what a revision holds: `data.spec`, the NodeWright's spec as the API server stored it (defaults and
  the webhook's mutations applied), without `revisionHistoryLimit` (which says how much history to
  keep, not what to roll out; an undo keeps the value in force);
- identity: the SHA-256 of the canonical JSON of that spec (`spec_hash`); the name is
  `<nodewright>-<first 10 hex digits>`, with `-<n>` appended when another object holds the name (a
  revision of an earlier NodeWright of the same name, not collected yet, or a hash prefix collision);
- `sync` decides, for the NodeWright as observed (one generation), which revision to create, which to
  give the next number (a spec that came back), and which to delete: duplicates of one spec (two
  writers raced) and the oldest beyond the limit, never the current one;
- who changed the spec, as far as the API tells: the field manager of the newest `managedFields`
  entry that owns `spec` fields on the main resource, with its operation and time (`last_spec_change`;
  the API server records the client's field manager, e.g. `kubectl-client-side-apply`, `argocd-
  controller`, `kubectl-nodewright`, not the user);
- `undo_target`: the revision an undo goes to -- the one before the current spec's, like `kubectl
  rollout undo`, or a given number -- or why there is none (`UndoRefusal`, typed);
- `UndoHint`: what a Halted condition and the halt notification say to go back (the revision and the
  exact command).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from nodewright.api import constants

JSON = Mapping[str, Any]

LIMIT_FIELD = "revisionHistoryLimit"
GENERATION_ANNOTATION = f"{constants.PREFIX}generation"
CHANGED_BY_ANNOTATION = f"{constants.PREFIX}changed-by"
CHANGE_OPERATION_ANNOTATION = f"{constants.PREFIX}change-operation"
CHANGED_AT_ANNOTATION = f"{constants.PREFIX}changed-at"
HASH_PREFIX = 10


@dataclass(frozen=True, slots=True)
class Change:
    """The last write of the spec as the API server recorded it (`metadata.managedFields`)."""

    manager: str
    operation: str = ""
    time: str = ""

    def describe(self) -> str:
        return f"{self.manager} ({self.operation})" if self.operation else self.manager


@dataclass(frozen=True, slots=True)
class Revision:
    """One kept spec. `spec` is the JSON the revision holds (without `revisionHistoryLimit`)."""

    name: str
    number: int
    hash: str
    spec: JSON
    generation: int | None = None
    change: Change | None = None
    uid: str = ""
    resource_version: str = ""

    @property
    def packages(self) -> str:
        """`name:version` of each package, sorted, comma-separated (the printer column's form)."""
        return package_list(self.spec)


@dataclass(frozen=True, slots=True)
class Observed:
    """The NodeWright as one rollout pass sees it: one generation of its spec."""

    name: str
    uid: str
    generation: int | None
    spec: JSON
    change: Change | None = None
    limit: int = 10


@dataclass(frozen=True, slots=True)
class RevisionSync:
    """What to write so the history holds the observed spec as its newest revision.

    `create` is a new revision, `renumber` an existing one (the same spec) given the next number and
    the observed generation and change, `delete` names revisions to remove; `history` is what the
    history is once that is done, oldest first."""

    create: Revision | None
    renumber: Revision | None
    delete: tuple[Revision, ...]
    history: tuple[Revision, ...]

    @property
    def changes(self) -> bool:
        return self.create is not None or self.renumber is not None or bool(self.delete)


# ----------------------------------------------------------------------------------------------------
# Identity


def revision_spec(spec: JSON) -> dict[str, Any]:
    """The part of a NodeWright spec a revision holds: all of it but `revisionHistoryLimit`."""
    return {k: v for k, v in spec.items() if k != LIMIT_FIELD}


def spec_hash(spec: JSON) -> str:
    """SHA-256 (hex) of the canonical JSON of `revision_spec(spec)`."""
    canonical = json.dumps(revision_spec(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def revision_name(nodewright: str, digest: str, taken: Collection[str]) -> str:
    """`<nodewright>-<hash prefix>`, or with `-<n>` (smallest free) when that name is taken."""
    base = f"{nodewright}-{digest[:HASH_PREFIX]}"
    if base not in taken:
        return base
    return next(f"{base}-{n}" for n in range(1, len(taken) + 2) if f"{base}-{n}" not in taken)


def revision_selector(nodewright: str) -> str:
    """The label selector of a NodeWright's revisions (what the operator writes and `history` lists)."""
    return (
        f"{constants.POD_OWNER_LABEL}={constants.POD_OWNER_VALUE},"
        f"{constants.POD_LABEL_NODEWRIGHT}={nodewright}"
    )


def package_list(spec: JSON) -> str:
    packages = spec.get("packages")
    if not isinstance(packages, Mapping):
        return ""
    return ",".join(
        f"{name}:{pkg.get('version', '?') if isinstance(pkg, Mapping) else '?'}"
        for name, pkg in sorted(packages.items())
    )


# ----------------------------------------------------------------------------------------------------
# Reading what the API server holds


def last_spec_change(managed_fields: object) -> Change | None:
    """The newest managedFields entry of the main resource (not a subresource such as status) that
    owns fields under `spec`: its manager, operation and time. None when no entry says so."""
    best: tuple[str, Change] | None = None
    for entry in managed_fields if isinstance(managed_fields, list) else ():
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        fields = entry.get("fieldsV1")
        if not isinstance(fields, Mapping) or "f:spec" not in fields:
            continue
        time = str(entry.get("time") or "")
        change = Change(str(entry.get("manager") or "unknown"), str(entry.get("operation") or ""), time)
        if best is None or time >= best[0]:
            best = (time, change)
    return best[1] if best is not None else None


def observed(obj: JSON) -> Observed:
    """The `Observed` of a NodeWright object as the API server returns it."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    limit = spec.get(LIMIT_FIELD)
    generation = meta.get("generation")
    return Observed(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        generation=generation if isinstance(generation, int) else None,
        spec=spec,
        change=last_spec_change(meta.get("managedFields")),
        limit=limit if isinstance(limit, int) and limit >= 0 else 10,
    )


def parse_revision(obj: JSON, *, owner_uid: str) -> Revision | None:
    """A ControllerRevision of the NodeWright with uid `owner_uid`; None when another object owns it or
    it holds no spec (it is then left alone: its owner's garbage collection removes it)."""
    meta = obj.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    if not any(isinstance(o, Mapping) and o.get("uid") == owner_uid for o in owners):
        return None
    data = obj.get("data")
    spec = data.get("spec") if isinstance(data, Mapping) else None
    number = obj.get("revision")
    if not isinstance(spec, Mapping) or not isinstance(number, int):
        return None
    annotations = meta.get("annotations") or {}
    generation = annotations.get(GENERATION_ANNOTATION, "")
    manager = annotations.get(CHANGED_BY_ANNOTATION)
    return Revision(
        name=str(meta.get("name") or ""),
        number=number,
        hash=spec_hash(spec),
        spec=spec,
        generation=int(generation) if str(generation).isdigit() else None,
        change=(
            Change(
                str(manager),
                str(annotations.get(CHANGE_OPERATION_ANNOTATION) or ""),
                str(annotations.get(CHANGED_AT_ANNOTATION) or ""),
            )
            if manager
            else None
        ),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


# ----------------------------------------------------------------------------------------------------
# Deciding


def sync(nodewright: Observed, existing: Sequence[Revision], *, taken: Collection[str] = ()) -> RevisionSync:
    """The writes that make `nodewright.spec` the newest revision and keep `nodewright.limit` older
    ones (module docstring). `existing` are this NodeWright's revisions, `taken` the names of other
    objects that might collide. Applying the result and calling again yields no change."""
    digest = spec_hash(nodewright.spec)
    kept, duplicates = _unique(existing)
    newest = max((r.number for r in kept), default=0)
    match = next((r for r in kept if r.hash == digest), None)
    create: Revision | None = None
    renumber: Revision | None = None
    if match is None:
        names = {*taken, *(r.name for r in existing)}
        create = Revision(
            name=revision_name(nodewright.name, digest, names),
            number=newest + 1,
            hash=digest,
            spec=revision_spec(nodewright.spec),
            generation=nodewright.generation,
            change=nodewright.change,
        )
        kept = [*kept, create]
    elif match.number != newest:
        renumber = replace(
            match, number=newest + 1, generation=nodewright.generation, change=nodewright.change
        )
        kept = [renumber if r.name == match.name else r for r in kept]
    history = sorted(kept, key=lambda r: r.number)
    pruned = history[: max(0, len(history) - (nodewright.limit + 1))]
    history = history[len(pruned) :]
    return RevisionSync(create, renumber, (*duplicates, *pruned), tuple(history))


def _unique(revisions: Iterable[Revision]) -> tuple[list[Revision], list[Revision]]:
    """One revision per spec (the highest number, then the name) and the duplicates to delete."""
    best: dict[str, Revision] = {}
    duplicates: list[Revision] = []
    for rev in sorted(revisions, key=lambda r: (r.number, r.name), reverse=True):
        if rev.hash in best:
            duplicates.append(rev)
        else:
            best[rev.hash] = rev
    return list(best.values()), duplicates


# ----------------------------------------------------------------------------------------------------
# Undo


class UndoProblem(StrEnum):
    """Why there is no revision to go back to."""

    NO_HISTORY = "NoHistory"
    NO_PREVIOUS = "NoPreviousRevision"
    NOT_FOUND = "RevisionNotFound"
    CURRENT = "AlreadyCurrent"


@dataclass(frozen=True, slots=True)
class UndoRefusal:
    problem: UndoProblem
    nodewright: str
    revision: int | None = None
    available: tuple[int, ...] = ()

    @property
    def message(self) -> str:
        name = self.nodewright
        if self.problem is UndoProblem.NO_HISTORY:
            return (
                f"NodeWright {name!r} has no revisions (the operator records them when it sees a new spec;"
                " revisionHistoryLimit 0 keeps only the current one)"
            )
        if self.problem is UndoProblem.NO_PREVIOUS:
            return f"NodeWright {name!r} has no revision before the current spec"
        if self.problem is UndoProblem.NOT_FOUND:
            have = ", ".join(str(n) for n in self.available) or "none"
            return f"NodeWright {name!r} has no revision {self.revision} (revisions: {have})"
        return f"NodeWright {name!r} is at revision {self.revision} already: nothing to undo"


def current_revision(history: Sequence[Revision], *, current_hash: str) -> Revision | None:
    """The revision holding the current spec (None: not recorded yet)."""
    return next((r for r in history if r.hash == current_hash), None)


def undo_target(
    nodewright: str, history: Sequence[Revision], *, current_hash: str, to_revision: int | None = None
) -> Revision | UndoRefusal:
    """The revision an undo writes back: `to_revision`, or the newest one before the current spec's
    (the newest recorded one when the current spec is not recorded yet)."""
    if not history:
        return UndoRefusal(UndoProblem.NO_HISTORY, nodewright)
    numbers = tuple(sorted(r.number for r in history))
    if to_revision is not None:
        wanted = next((r for r in history if r.number == to_revision), None)
        if wanted is None:
            return UndoRefusal(UndoProblem.NOT_FOUND, nodewright, to_revision, numbers)
        if wanted.hash == current_hash:
            return UndoRefusal(UndoProblem.CURRENT, nodewright, to_revision, numbers)
        return wanted
    current = current_revision(history, current_hash=current_hash)
    below = [r for r in history if r.hash != current_hash and (current is None or r.number < current.number)]
    if not below:
        return UndoRefusal(UndoProblem.NO_PREVIOUS, nodewright, None, numbers)
    return max(below, key=lambda r: r.number)


@dataclass(frozen=True, slots=True)
class UndoHint:
    """The way back a halt names: the revision before the current spec and the command that restores
    it (typed, so the condition, the Event and the notification say the same)."""

    nodewright: str
    revision: int
    packages: str

    @property
    def command(self) -> str:
        return f"kubectl nodewright undo {self.nodewright} --to-revision {self.revision}"

    @property
    def sentence(self) -> str:
        what = f" ({self.packages})" if self.packages else ""
        return f"to go back to revision {self.revision}{what}: {self.command}"


def undo_hint(nodewright: str, history: Sequence[Revision], *, current_hash: str) -> UndoHint | None:
    """The hint for a halt of the current spec: None without an earlier revision."""
    target = undo_target(nodewright, history, current_hash=current_hash)
    if isinstance(target, UndoRefusal):
        return None
    return UndoHint(nodewright, target.number, target.packages)
