"""The revision history's decisions (`plan.revisions`): what to create, renumber and delete; who changed
the spec; which revision an undo goes to; what a Halted condition says to go back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st

from nodewright.api.models import NodeWright, NodeWrightSpec, ObjectMeta, Package
from nodewright.api.reasons import HaltReason
from nodewright.plan import revisions as rv
from nodewright.plan.revisions import (
    Change,
    Observed,
    Revision,
    UndoHint,
    UndoProblem,
    UndoRefusal,
    last_spec_change,
    parse_revision,
    revision_name,
    spec_hash,
    sync,
    undo_hint,
    undo_target,
)
from nodewright.plan.rollout import Halt, plan_rollout
from nodewright.plan.status import HALTED, aggregate_status


def spec(version: str, **extra: Any) -> dict[str, Any]:
    return {"packages": {"tune": {"name": "tune", "version": version, "image": "x/tune"}}, **extra}


def seen(version: str, generation: int, *, limit: int = 10) -> Observed:
    return Observed("nw", "uid-1", generation, spec(version, revisionHistoryLimit=limit), None, limit)


class Store:
    """The revisions as the API server would hold them after the writes `sync` decided."""

    def __init__(self) -> None:
        self.revisions: dict[str, Revision] = {}

    def apply(self, decided: rv.RevisionSync) -> None:
        for old in decided.delete:
            del self.revisions[old.name]
        for new in (decided.create, decided.renumber):
            if new is not None:
                self.revisions[new.name] = new

    def observe(self, nodewright: Observed) -> rv.RevisionSync:
        decided = sync(nodewright, list(self.revisions.values()))
        self.apply(decided)
        return decided


def test_a_new_spec_is_a_new_revision_and_one_that_comes_back_takes_the_next_number() -> None:
    store = Store()
    first = store.observe(seen("1.0.0", 1))
    assert first.create is not None and first.create.number == 1
    assert first.create.name == f"nw-{spec_hash(spec('1.0.0'))[:10]}"
    assert "revisionHistoryLimit" not in first.create.spec, "the limit is not what a revision rolls out"
    store.observe(seen("2.0.0", 2))
    back = store.observe(seen("1.0.0", 3))
    assert back.create is None and back.renumber is not None
    assert (back.renumber.name, back.renumber.number, back.renumber.generation) == (first.create.name, 3, 3)
    assert [(r.number, r.packages) for r in back.history] == [(2, "tune:2.0.0"), (3, "tune:1.0.0")]
    # The same generation again, or only the limit changed: nothing to write.
    assert not store.observe(seen("1.0.0", 3)).changes
    assert not store.observe(seen("1.0.0", 4, limit=5)).changes


def test_history_is_bounded_by_the_limit_and_never_loses_the_current_spec() -> None:
    store = Store()
    for generation, version in enumerate(["1.0.0", "1.1.0", "1.2.0", "1.3.0"], start=1):
        store.observe(seen(version, generation, limit=2))
    assert sorted(r.number for r in store.revisions.values()) == [2, 3, 4]
    decided = store.observe(seen("1.4.0", 5, limit=0))
    assert [r.packages for r in decided.history] == ["tune:1.4.0"]
    assert sorted(r.number for r in decided.delete) == [2, 3, 4]


def test_duplicates_are_removed_and_taken_names_avoided() -> None:
    digest = spec_hash(spec("1.0.0"))
    one = Revision("nw-a", 1, digest, spec("1.0.0"))
    again = Revision("nw-b", 2, digest, spec("1.0.0"))
    decided = sync(seen("1.0.0", 7), [one, again])
    assert [r.name for r in decided.delete] == ["nw-a"] and decided.history == (again,)
    taken = {f"nw-{digest[:10]}", f"nw-{digest[:10]}-1"}
    assert revision_name("nw", digest, taken) == f"nw-{digest[:10]}-2"
    fresh = sync(seen("1.0.0", 1), [], taken=taken)
    assert fresh.create is not None and fresh.create.name == f"nw-{digest[:10]}-2"


@settings(max_examples=200, deadline=None)
@given(
    edits=st.lists(st.sampled_from(["1.0.0", "1.1.0", "2.0.0", "3.0.0"]), min_size=1, max_size=25),
    limit=st.integers(min_value=0, max_value=4),
)
def test_the_history_holds_the_latest_distinct_specs_in_order(edits: list[str], limit: int) -> None:
    """Deployment semantics: after any sequence of accepted specs the history is the last `limit + 1`
    distinct specs, ordered by when each was last applied, the current one newest; numbers only grow;
    syncing again writes nothing."""
    store = Store()
    numbers_seen: dict[str, int] = {}
    for generation, version in enumerate(edits, start=1):
        decided = store.observe(seen(version, generation, limit=limit))
        history = sorted(store.revisions.values(), key=lambda r: r.number)
        assert history == list(decided.history)
        assert history[-1].hash == spec_hash(spec(version)), "the current spec is the newest revision"
        assert len({r.hash for r in history}) == len(history) <= limit + 1
        for r in history:
            assert r.number >= numbers_seen.get(r.name, 0)
            numbers_seen[r.name] = r.number
        assert not sync(seen(version, generation, limit=limit), history).changes
    latest: list[str] = []
    for version in edits:
        latest = [v for v in latest if v != version] + [version]
    note(f"history {[r.packages for r in store.revisions.values()]}")
    expected = [f"tune:{v}" for v in latest[-(limit + 1) :]]
    assert [r.packages for r in sorted(store.revisions.values(), key=lambda r: r.number)] == expected


def test_last_spec_change_is_the_newest_owner_of_spec_fields_on_the_main_resource() -> None:
    fields = [
        {"manager": "kubectl-client-side-apply", "operation": "Update", "time": "2026-01-01T10:00:00Z",
         "fieldsV1": {"f:spec": {"f:packages": {}}}},
        {"manager": "argocd-controller", "operation": "Apply", "time": "2026-01-02T10:00:00Z",
         "fieldsV1": {"f:metadata": {}, "f:spec": {}}},
        {"manager": "nodewright", "operation": "Update", "time": "2026-01-03T10:00:00Z",
         "fieldsV1": {"f:metadata": {"f:finalizers": {}}}},
        {"manager": "nodewright", "operation": "Update", "time": "2026-01-04T10:00:00Z",
         "subresource": "status", "fieldsV1": {"f:status": {}}},
    ]  # fmt: skip
    assert last_spec_change(fields) == Change("argocd-controller", "Apply", "2026-01-02T10:00:00Z")
    assert last_spec_change([]) is None and last_spec_change("junk") is None


def test_parse_revision_reads_only_the_owners_revisions() -> None:
    obj = {
        "metadata": {
            "name": "nw-abc",
            "uid": "r1",
            "resourceVersion": "9",
            "ownerReferences": [{"uid": "uid-1", "kind": "NodeWright", "name": "nw"}],
            "annotations": {rv.GENERATION_ANNOTATION: "4", rv.CHANGED_BY_ANNOTATION: "kubectl-edit"},
        },
        "data": {"spec": spec("1.0.0")},
        "revision": 3,
    }
    parsed = parse_revision(obj, owner_uid="uid-1")
    assert parsed is not None
    assert (parsed.number, parsed.generation, parsed.change) == (3, 4, Change("kubectl-edit"))
    assert parsed.hash == spec_hash(spec("1.0.0")) and parsed.resource_version == "9"
    assert parse_revision(obj, owner_uid="another") is None
    assert parse_revision({**obj, "data": {}}, owner_uid="uid-1") is None


def _history(*versions: str) -> list[Revision]:
    return [Revision(f"nw-{v}", n, spec_hash(spec(v)), spec(v)) for n, v in enumerate(versions, start=1)]


def test_undo_goes_to_the_revision_before_the_current_one_or_the_one_asked_for() -> None:
    history = _history("1.0.0", "2.0.0", "3.0.0")
    current = spec_hash(spec("3.0.0"))
    target = undo_target("nw", history, current_hash=current)
    assert isinstance(target, Revision) and target.number == 2
    asked = undo_target("nw", history, current_hash=current, to_revision=1)
    assert isinstance(asked, Revision) and asked.packages == "tune:1.0.0"
    # The current spec not recorded yet (the operator has not seen it): the newest recorded revision.
    unseen = undo_target("nw", history, current_hash=spec_hash(spec("9.0.0")))
    assert isinstance(unseen, Revision) and unseen.number == 3

    def problem(result: Revision | UndoRefusal) -> UndoProblem | None:
        return result.problem if isinstance(result, UndoRefusal) else None

    assert problem(undo_target("nw", [], current_hash=current)) is UndoProblem.NO_HISTORY
    assert problem(undo_target("nw", history[:1], current_hash=spec_hash(spec("1.0.0")))) is (
        UndoProblem.NO_PREVIOUS
    )
    missing = undo_target("nw", history, current_hash=current, to_revision=7)
    assert problem(missing) is UndoProblem.NOT_FOUND
    assert isinstance(missing, UndoRefusal) and "revisions: 1, 2, 3" in missing.message
    assert problem(undo_target("nw", history, current_hash=current, to_revision=3)) is UndoProblem.CURRENT


def test_the_halted_condition_names_the_revision_to_go_back_to_and_the_command() -> None:
    model = NodeWright(
        metadata=ObjectMeta(name="drivers", generation=2),
        spec=NodeWrightSpec(packages={"tune": Package(version="2.0.0", image="x/tune")}),
    )
    hint = undo_hint("drivers", _history("1.0.0", "2.0.0"), current_hash=spec_hash(spec("2.0.0")))
    assert hint == UndoHint("drivers", 1, "tune:1.0.0")
    plan = plan_rollout(
        model, policy=None, nodes=[], compartment_statuses={}, fingerprint="f", now="2026-01-01T00:00:00Z"
    )
    halted = replace(
        plan, halts=(Halt("__default__", HaltReason.FAILURE_THRESHOLD, ("n1",), 1, "halted: n1"),)
    )
    summary = aggregate_status(model, nodes=[], plan=halted, now="2026-01-01T00:00:00Z", undo=hint)
    condition = next(c for c in summary.status.conditions or [] if c.type == HALTED)
    assert condition.status == "True"
    assert condition.message == (
        "halted: n1; to go back to revision 1 (tune:1.0.0): kubectl nodewright undo drivers --to-revision 1"
    )
    calm = aggregate_status(model, nodes=[], plan=plan, now="2026-01-01T00:00:00Z", undo=hint)
    assert next(c for c in calm.status.conditions or [] if c.type == HALTED).message == ""
