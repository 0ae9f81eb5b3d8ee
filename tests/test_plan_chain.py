"""Chained runs (`--chain-packages`): dependents' runs in the pod of the package they depend on."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodewright.api.models import Interrupt, InterruptType, Package
from nodewright.api.nodestate import PackageStage, PackageState
from nodewright.plan.node import BindPod, CreatePod, DeletePod, Event, NodePlan, PlanOptions
from nodewright.plan.stages import PodOutcome
from tests.planfake import FakeNode
from tests.test_plan_node import make_nw

CHAINED = PlanOptions(chain_packages=True)


def events(plans: list[NodePlan], reason: str) -> list[str]:
    return [a.message for p in plans for a in p.actions if isinstance(a, Event) and a.reason == reason]


def pkg(name: str, *deps: str, **kw: Any) -> Package:
    return Package(
        version="1.0.0",
        image=f"ghcr.io/x/{name}",
        dependsOn=dict.fromkeys(deps, "1.0.0") or None,
        **kw,
    )


def chain_of_three(**kw: Any) -> dict[str, Package]:
    return {"pa": pkg("pa"), "pb": pkg("pb", "pa"), "pc": pkg("pc", "pb", **kw)}


def test_without_the_option_every_package_has_its_own_pod() -> None:
    node = FakeNode(make_nw(packages=chain_of_three()))
    assert node.run().status.value == "complete"
    assert [(c.package, c.chain) for c in node.created] == [("pa", ()), ("pb", ()), ("pc", ())]


def test_a_dependency_chain_installs_in_one_pod() -> None:
    node = FakeNode(make_nw(packages=chain_of_three()), options=CHAINED)
    plan = node.run()
    assert plan.status.value == "complete"
    assert len(node.created) == 1
    head = node.created[0]
    assert (head.package, head.stage) == ("pa", PackageStage.APPLY)
    assert head.chain == (("pb", "1.0.0", PackageStage.APPLY), ("pc", "1.0.0", PackageStage.APPLY))
    state = node.state
    assert state is not None
    done = (PackageStage.CONFIG, PackageState.COMPLETE)
    assert {e.name: (e.stage, e.state) for e in state.packages} == dict.fromkeys(("pa", "pb", "pc"), done)
    started = events(node.plans, "PackageStarted")
    assert started == ["pa:1.0.0 apply, config; then pb:1.0.0 apply, config; then pc:1.0.0 apply, config"]
    # One state write when the pod starts and one when it ends: the chained entries appear complete.
    writes = [p.state for p in node.plans]
    distinct = [w for i, w in enumerate(writes) if i == 0 or w != writes[i - 1]]
    assert len(distinct) <= 3, distinct


def test_a_failure_in_a_chained_run_keeps_what_finished_and_retries_from_there() -> None:
    fates = iter(["fail@pb:config"])

    def outcome(_: CreatePod) -> str:
        return next(fates, "succeed")

    node = FakeNode(make_nw(packages=chain_of_three()), outcomes=outcome, options=CHAINED)
    assert node.run().status.value == "complete"
    first, retry = node.created
    assert first.package == "pa" and len(first.chain) == 2
    # pa finished and pb's apply too: the retry is pb's config, attempt 2, with pc after it.
    assert (retry.package, retry.stage, retry.attempt) == ("pb", PackageStage.CONFIG, 2)
    assert retry.chain == (("pc", "1.0.0", PackageStage.APPLY),)
    retried = events(node.plans, "PackageFailed")  # the attempt failed and will be retried
    assert len(retried) == 1 and retried[0].startswith("pb:1.0.0: attempt 1/3 of config failed"), retried


def test_a_failure_in_the_head_retries_the_whole_chain() -> None:
    fates = iter(["fail@pa:config"])
    node = FakeNode(
        make_nw(packages=chain_of_three()), outcomes=lambda _: next(fates, "succeed"), options=CHAINED
    )
    assert node.run().status.value == "complete"
    _, retry = node.created
    assert (retry.package, retry.stage, retry.attempt) == ("pa", PackageStage.CONFIG, 2)
    assert [c[0] for c in retry.chain] == ["pb", "pc"]


def test_runs_with_an_interrupt_or_a_dependency_outside_the_pod_are_not_chained() -> None:
    reboot = Interrupt(type=InterruptType.REBOOT)
    packages = {
        "pa": pkg("pa"),
        "pb": pkg("pb", "pa", interrupt=reboot),  # needs the node drained: a pod of its own
        "pc": pkg("pc", "pa", "px"),  # px is outside pa's pod
        "pd": pkg("pd", "pa"),
        "px": pkg("px"),
    }
    node = FakeNode(make_nw(packages=packages), options=CHAINED)
    assert node.run().status.value == "complete"
    heads = {c.package: [link[0] for link in c.chain] for c in node.created if c.stage is PackageStage.APPLY}
    assert heads["pa"] == ["pd"]
    assert heads["px"] == []
    assert "pb" in heads and "pc" in heads


def test_observing_the_chained_pod_again_keeps_it() -> None:
    nw = make_nw(packages=chain_of_three())
    node = FakeNode(nw, outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    assert len(node.created) == 1
    for _ in range(3):
        plan = node.step()
        assert not [a for a in plan.actions if isinstance(a, DeletePod)], plan.actions
        assert not [a for a in plan.actions if isinstance(a, CreatePod)], plan.actions


def test_a_change_to_a_chained_package_replaces_the_pod() -> None:
    nw = make_nw(packages=chain_of_three())
    node = FakeNode(nw, outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    (head,) = node.created
    changed = chain_of_three()
    changed["pc"] = changed["pc"].model_copy(update={"image": "ghcr.io/x/pc-fixed"})
    node.nodewright = make_nw(packages=changed)
    plan = node.step()
    deleted = [a for a in plan.actions if isinstance(a, DeletePod)]
    assert [d.name for d in deleted] == [head.name]
    node.outcomes = lambda _: "succeed"
    assert node.run().status.value == "complete"


def test_a_chained_pod_left_unbound_by_a_restart_is_bound_not_replaced() -> None:
    node = FakeNode(make_nw(packages=chain_of_three()), outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    (pod,) = node.pods.values()
    pod.summary = replace(pod.summary, bound=False)
    plan = node.step()
    assert [a for a in plan.actions if isinstance(a, CreatePod | DeletePod)] == []
    assert [a.name for a in plan.actions if isinstance(a, BindPod)] == [pod.summary.name]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deps=st.lists(st.lists(st.integers(0, 4), max_size=2), min_size=1, max_size=5),
    interrupts=st.lists(st.booleans(), min_size=5, max_size=5),
    failing=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.sampled_from(["apply", "config"]))),
)
# Found by Hypothesis: pa's apply fails once, pb is ready for its reboot before pa's retry ends, and pc
# (after pa, also rebooting) became startable only then; it used to apply after pb's reboot and reboot again.
@example(deps=[[], [], [0]], interrupts=[False, True, True, False, False], failing=(0, "apply"))
def test_chained_rollouts_complete_and_keep_the_invariants(
    deps: list[list[int]], interrupts: list[bool], failing: tuple[int, str] | None
) -> None:
    """Any dependency DAG, some packages with a reboot, one stage failing once: the node completes,
    every package at its last stage, with no more pods than without chaining, and the fake's stage
    machine invariants (no skipped stage, interrupts only on a cordoned node) hold at every step."""
    names = [f"p{'abcde'[i]}" for i in range(len(deps))]
    packages = {
        name: pkg(
            name,
            *sorted({names[d] for d in deps[i] if d < i}),
            interrupt=Interrupt(type=InterruptType.REBOOT) if interrupts[i] else None,
        )
        for i, name in enumerate(names)
    }
    fates = iter([f"fail@{names[failing[0] % len(names)]}:{failing[1]}"] if failing else [])

    def outcome(_: CreatePod) -> str:
        return next(fates, "succeed")

    plain = FakeNode(make_nw(packages=packages))
    assert plain.run(max_steps=800).status.value == "complete"
    node = FakeNode(make_nw(packages=packages), outcomes=outcome, options=CHAINED)
    plan = node.run(max_steps=800)
    assert plan.status.value == "complete", plan.condition.message
    state = node.state
    assert state is not None
    assert all(e.state is PackageState.COMPLETE for e in state.packages)
    assert {e.name for e in state.packages} == set(names)
    assert len(node.created) <= len(plain.created) + (1 if failing else 0)
    assert all(p.summary.outcome is not PodOutcome.RUNNING for p in node.pods.values())


def test_a_chained_pod_runs_each_package_in_order_and_reads_back_per_run() -> None:
    from nodewright.api import constants
    from nodewright.controller.pods import summarize
    from nodewright.kube.trim import trim_pod
    from nodewright.plan import podspec

    nw = make_nw(packages=chain_of_three(env=[{"name": "NODEWRIGHT_SIM_DURATION", "value": "1s"}]))
    opts = podspec.PodOptions(namespace="ns", agent_image="agent:1", pause_image="pause:3")
    links = [podspec.ChainLink(n, nw.spec.packages[n], "1.0.0", PackageStage.APPLY) for n in ("pb", "pc")]

    def build(chain: list[podspec.ChainLink]) -> dict[str, Any]:
        return podspec.build_pod(
            nw,
            nw.spec.packages["pa"],
            package_name="pa",
            version="1.0.0",
            stage=PackageStage.APPLY,
            node="n1",
            attempt=1,
            node_order=0,
            options=opts,
            chain=chain,
        )

    plain, pod = build([]), build(links)
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == [
        f"{p}-{m}"
        for p in ("pa", "pb", "pc")
        for m in ("init", "apply", "applycheck", "config", "configcheck")
    ]
    assert pod["metadata"]["annotations"][constants.POD_ANNOTATION_CHAIN] == (
        '[["pb","1.0.0","apply"],["pc","1.0.0","apply"]]'
    )
    assert constants.POD_ANNOTATION_CHAIN not in plain["metadata"]["annotations"]
    assert pod["metadata"]["name"] != plain["metadata"]["name"], "the chain is part of the pod's identity"
    # pc's own environment is on pc's containers only.
    env = {c["name"]: {e["name"] for e in c.get("env") or []} for c in pod["spec"]["initContainers"]}
    assert "NODEWRIGHT_SIM_DURATION" in env["pc-apply"] and "NODEWRIGHT_SIM_DURATION" not in env["pa-apply"]

    def term(name: str, code: int) -> dict[str, Any]:
        return {
            "name": name,
            "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}},
        }

    failing = names.index("pb-config")
    pod["metadata"].update(uid="u1", creationTimestamp="2024-01-01T00:00:00Z")
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {
        "phase": "Failed",
        "initContainerStatuses": [
            term(n, 1 if i == failing else 0) for i, n in enumerate(names[: failing + 1])
        ],
    }
    summary = summarize(trim_pod(pod), version_of={})
    assert summary is not None and summary.outcome is PodOutcome.FAILED
    assert [p.done for p in summary.progress] == [True, True]
    (pb, pc) = summary.chain
    assert (pb.package, [p.done for p in pb.progress]) == ("pb", [True, False])
    assert (pc.package, [p.done for p in pc.progress]) == ("pc", [False, False])
    assert summary.packages() == ("pa", "pb", "pc") and summary.stage_count == 6
    # Its kept log is filed under pb's config, pb's first attempt (controller.nodes._keep_log).
    from nodewright.controller.nodes import _failed_chained_run

    assert _failed_chained_run(summary) == ("pb", "1.0.0", PackageStage.CONFIG, 1)
    pod["metadata"]["annotations"][constants.POD_ANNOTATION_CHAIN] = '[["pb","1.0.0","interrupt"]]'
    assert summarize(trim_pod(pod), version_of={}) is None, "a chain we never write is not one of our pods"


def _set_progress(node: FakeNode, *, own_done: int, chain_done: tuple[int, ...]) -> None:
    """The running chained pod got this far: its own run's first `own_done` stages, then per run."""
    from tests.planfake import _progress

    (pod,) = node.pods.values()
    summary = pod.summary
    pod.summary = replace(
        summary,
        progress=_progress(summary.stage, done=own_done),
        chain=tuple(
            replace(run, progress=_progress(run.stage, done=d))
            for run, d in zip(summary.chain, chain_done, strict=True)
        ),
    )


def test_a_replaced_chained_pod_keeps_what_it_completed() -> None:
    node = FakeNode(make_nw(packages=chain_of_three()), outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    (head,) = node.created
    _set_progress(node, own_done=2, chain_done=(2, 1))  # pa and pb done, pc's apply done
    changed = chain_of_three()
    changed["pc"] = changed["pc"].model_copy(update={"image": "ghcr.io/x/pc-fixed"})
    node.nodewright = make_nw(packages=changed)
    plan = node.step()
    assert [a.name for a in plan.actions if isinstance(a, DeletePod)] == [head.name]
    state = node.state
    assert state is not None
    got = {e.name: (e.stage.value, e.state.value) for e in state.packages}
    assert got["pa"] == ("config", "complete") and got["pb"] == ("config", "complete"), got
    assert got["pc"][0] == "config", "pc's apply ran on the host: it continues at config"
    node.outcomes = lambda _: "succeed"
    assert node.run().status.value == "complete"
    assert [(c.package, c.stage) for c in node.created[1:]] == [("pc", PackageStage.CONFIG)]


def test_an_uninstall_asked_for_while_chained_never_cuts_the_install_short() -> None:
    from nodewright.api.models import Uninstall

    node = FakeNode(make_nw(packages=chain_of_three()), outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    asked = chain_of_three()
    asked["pc"] = asked["pc"].model_copy(update={"uninstall": Uninstall(enabled=True, apply=True)})
    node.nodewright = make_nw(packages=asked)
    for _ in range(3):
        plan = node.step()
        assert not [a for a in plan.actions if isinstance(a, DeletePod)], "the chained pod runs on"
    for pod in node.pods.values():
        pod.fate = "succeed"
    node.outcomes = lambda _: "succeed"
    node.run()
    # pc was installed by the chained pod, recorded, and then uninstalled by its own pod.
    assert [(c.package, c.stage) for c in node.created] == [
        ("pa", PackageStage.APPLY),
        ("pc", PackageStage.UNINSTALL),
    ]
    state = node.state
    assert state is not None and {e.name for e in state.packages} == {"pa", "pb"}


def test_a_package_removed_while_chained_leaves_a_marker_of_what_ran() -> None:
    node = FakeNode(make_nw(packages=chain_of_three()), outcomes=lambda _: "hang", options=CHAINED)
    node.step()
    _set_progress(node, own_done=2, chain_done=(2, 1))
    packages = chain_of_three()
    del packages["pc"]
    node.nodewright = make_nw(packages=packages)
    node.step()
    state = node.state
    assert state is not None
    pc = state.entry("pc", "1.0.0")
    assert pc is not None and pc.state is PackageState.IN_PROGRESS, "files of pc may be on the host"


def test_a_deleted_nodewright_keeps_the_packages_a_running_pod_carries() -> None:
    from nodewright.api import constants
    from nodewright.api.nodestate import NodeState, PackageEntry
    from nodewright.controller.nodes import _deletion_spec

    nw = make_nw(packages=chain_of_three())
    state = NodeState(packages=(PackageEntry("pa", "1.0.0", PackageStage.APPLY, PackageState.IN_PROGRESS),))
    annotation = '[["pb","1.0.0","apply"],["pc","1.0.0","apply"]]'
    pod = {"metadata": {"annotations": {constants.POD_ANNOTATION_CHAIN: annotation}}}
    assert set(_deletion_spec(nw, state, [pod]).spec.packages) == {"pa", "pb", "pc"}
    assert set(_deletion_spec(nw, state).spec.packages) == {"pa"}, "without the pod only pa is in flight"


def test_a_dependent_that_becomes_startable_before_a_pending_reboot_joins_it() -> None:
    """Without chaining too: one reboot covers both packages although pa's retry delayed pc."""
    reboot = Interrupt(type=InterruptType.REBOOT)
    packages = {"pa": pkg("pa"), "pb": pkg("pb", interrupt=reboot), "pc": pkg("pc", "pa", interrupt=reboot)}
    fates = iter(["fail@pa:apply"])
    node = FakeNode(make_nw(packages=packages), outcomes=lambda _: next(fates, "succeed"))
    assert node.run(max_steps=800).status.value == "complete"
    assert node.reboots == 1
    interrupts = [c for c in node.created if c.stage is PackageStage.INTERRUPT]
    assert [(c.package, c.covers) for c in interrupts] == [("pb", ("pc",))]
