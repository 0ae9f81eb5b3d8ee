"""Compartment assignment, ceilings, legacy interruptionBudget translation and reset precedence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import (
    Budget,
    Compartment,
    DeploymentPolicy,
    DeploymentPolicyOptions,
    DeploymentPolicySpec,
    ExponentialStrategy,
    FixedStrategy,
    LabelSelector,
    LabelSelectorRequirement,
    LinearStrategy,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    PolicyBudget,
    PolicyDefault,
    Strategy,
)
from nodewright.api.reasons import PolicyNotFound
from nodewright.plan import selectors
from nodewright.plan.policy import (
    BudgetSpec,
    Compartments,
    NodeRef,
    StrategyKind,
    ceiling_for,
    reset_on_completion,
    resolve_compartments,
)

DEFAULT = constants.DEFAULT_COMPARTMENT


def nw(**spec: object) -> NodeWright:
    return NodeWright(metadata=ObjectMeta(name="nw"), spec=NodeWrightSpec.model_validate(spec))


def pol(*compartments: Compartment, reset: bool = True) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="p"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(
                budget=PolicyBudget(percent=10), strategy=Strategy(linear=LinearStrategy(delta=2))
            ),
            compartments=list(compartments) or None,
            reset_batch_state_on_completion=reset,
        ),
    )


def comp(name: str, strategy: Strategy | None, count: int, **labels: str) -> Compartment:
    return Compartment(
        name=name,
        selector=LabelSelector(match_labels=labels),
        budget=PolicyBudget(count=count),
        strategy=strategy,
    )


@pytest.mark.parametrize(
    ("matched", "percent", "expected"), [(10, 25, 2), (10, 30, 3), (5, 10, 1), (100, 1, 1), (0, 50, 0)]
)
def test_ceiling_table(matched: int, percent: int, expected: int) -> None:
    assert ceiling_for(BudgetSpec(percent=percent), matched) == expected


def test_ceiling_count_and_empty() -> None:
    assert ceiling_for(BudgetSpec(count=4), 20) == 4
    assert ceiling_for(BudgetSpec(count=4), 0) == 0


@given(st.integers(0, 10_000), st.integers(1, 100))
def test_percent_ceiling_is_at_least_one_and_never_above_matched(matched: int, percent: int) -> None:
    ceiling = ceiling_for(BudgetSpec(percent=percent), matched)
    assert (ceiling == 0) == (matched == 0)
    assert ceiling <= matched


def test_unmatched_nodes_go_to_default_with_policy_default_rules() -> None:
    gpu = comp("gpu", Strategy(fixed=FixedStrategy()), 1, accel="h100")
    nodes = [NodeRef("a", {"accel": "h100"}), NodeRef("b", {}), NodeRef("c", {"accel": "a100"})]
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(gpu), nodes=nodes)
    assert isinstance(result, Compartments)
    assert result.assignment == {"a": "gpu", "b": DEFAULT, "c": DEFAULT}
    assert result.members == {DEFAULT: ("b", "c"), "gpu": ("a",)}
    default = result.specs[DEFAULT]
    assert default.strategy is not None and default.strategy.kind is StrategyKind.LINEAR
    assert default.strategy.delta == 2
    assert result.ceiling(DEFAULT) == 1 and result.ceiling("gpu") == 1


def test_overlap_safety_then_ceiling_then_name() -> None:
    node = [NodeRef("n", {"a": "1", "b": "1"})]
    none = comp("none", None, 1, a="1")
    expo = comp("expo", Strategy(exponential=ExponentialStrategy()), 5, b="1")
    lin = comp("lin", Strategy(linear=LinearStrategy()), 5, a="1")
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(none, expo, lin), nodes=node)
    assert isinstance(result, Compartments) and result.assignment["n"] == "lin"
    big = comp("big", Strategy(fixed=FixedStrategy()), 3, a="1")
    small = comp("small", Strategy(fixed=FixedStrategy()), 2, b="1")
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(big, small), nodes=node)
    assert isinstance(result, Compartments) and result.assignment["n"] == "small"
    x = comp("x", Strategy(fixed=FixedStrategy()), 2, a="1")
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(x, small), nodes=node)
    assert isinstance(result, Compartments) and result.assignment["n"] == "small"


def test_match_expressions_are_honoured() -> None:
    sel = LabelSelector(match_expressions=[LabelSelectorRequirement(key="pool", operator="In", values=["x"])])
    c = Compartment(name="x", selector=sel, budget=PolicyBudget(count=1))
    nodes = [NodeRef("in", {"pool": "x"}), NodeRef("out", {"pool": "y"})]
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(c), nodes=nodes)
    assert isinstance(result, Compartments)
    assert result.assignment == {"in": "x", "out": DEFAULT}


def test_missing_policy_is_a_typed_result() -> None:
    result = resolve_compartments(nw(deployment_policy="gone"), policy=None, nodes=[])
    assert result == PolicyNotFound("gone")
    other = resolve_compartments(nw(deployment_policy="gone"), policy=pol(), nodes=[])
    assert isinstance(other, PolicyNotFound)


@pytest.mark.parametrize(
    ("budget", "nodes", "initial", "ceiling"),
    [
        (None, 10, 10, 10),
        (Budget(count=3), 10, 3, 3),
        (Budget(count=0), 10, 1, 1),
        (Budget(count=30), 10, 10, 30),
        (Budget(percent=25), 10, 2, 2),
        (Budget(percent=0), 10, 1, 1),
        (Budget(percent=25), 0, 1, 0),
    ],
)
def test_legacy_translation(budget: Budget | None, nodes: int, initial: int, ceiling: int) -> None:
    refs = [NodeRef(f"n{i}", {}) for i in range(nodes)]
    result = resolve_compartments(nw(interruption_budget=budget), policy=None, nodes=refs)
    assert isinstance(result, Compartments)
    assert result.policy_name == "legacy" and list(result.specs) == [DEFAULT]
    strategy = result.specs[DEFAULT].strategy
    assert strategy is not None and strategy.kind is StrategyKind.FIXED
    assert (strategy.initial_batch, strategy.batch_threshold, strategy.safety_limit) == (initial, 100, 50)
    assert strategy.failure_threshold is None
    assert result.ceiling(DEFAULT) == ceiling
    assert result.reset_on_completion is False


def test_reset_precedence() -> None:
    opts = DeploymentPolicyOptions(reset_batch_state_on_completion=False)
    assert reset_on_completion(nw(deployment_policy="p"), pol(reset=True)) is True
    assert reset_on_completion(nw(deployment_policy="p", deployment_policy_options=opts), pol()) is False
    opts_on = DeploymentPolicyOptions(reset_batch_state_on_completion=True)
    assert reset_on_completion(nw(deployment_policy_options=opts_on), None) is True
    assert reset_on_completion(nw(), None) is False
    assert reset_on_completion(nw(deployment_policy="p"), pol(reset=False)) is False


@given(st.lists(st.fixed_dictionaries({"a": st.sampled_from("xy"), "b": st.sampled_from("xy")}), max_size=30))
def test_every_node_in_exactly_one_compartment(labels: list[dict[str, str]]) -> None:
    policy = pol(
        comp("ax", Strategy(exponential=ExponentialStrategy()), 2, a="x"),
        comp("bx", Strategy(fixed=FixedStrategy()), 3, b="x"),
    )
    nodes = [NodeRef(f"n{i}", lab) for i, lab in enumerate(labels)]
    result = resolve_compartments(nw(deployment_policy="p"), policy=policy, nodes=nodes)
    assert isinstance(result, Compartments)
    members = [m for names in result.members.values() for m in names]
    assert sorted(members) == sorted(n.name for n in nodes)
    for node in nodes:
        expected = "bx" if node.labels["b"] == "x" else ("ax" if node.labels["a"] == "x" else DEFAULT)
        assert result.assignment[node.name] == expected


_KEYS = ("a", "b", "c")
_label_maps = st.dictionaries(st.sampled_from(_KEYS), st.sampled_from(["x", "y", ""]), max_size=3)
_requirements = st.one_of(
    st.builds(
        LabelSelectorRequirement,
        key=st.sampled_from(_KEYS),
        operator=st.sampled_from(["In", "NotIn"]),
        values=st.lists(st.sampled_from(["x", "y", ""]), min_size=1, max_size=2),
    ),
    st.builds(
        LabelSelectorRequirement,
        key=st.sampled_from(_KEYS),
        operator=st.sampled_from(["Exists", "DoesNotExist"]),
    ),
)
_selectors = st.builds(
    LabelSelector,
    match_labels=st.dictionaries(st.sampled_from(_KEYS), st.sampled_from(["x", "y"]), max_size=2),
    match_expressions=st.lists(_requirements, max_size=2),
)


@given(_selectors, _label_maps, _label_maps)
def test_a_selector_reads_only_its_keys(
    selector: LabelSelector, left: dict[str, str], right: dict[str, str]
) -> None:
    """The lemma compartment assignment groups nodes by: labels that agree on a selector's keys (values
    and absences) match it alike, whatever else they carry."""
    read = selectors.keys(selector)
    mixed = {k: v for k, v in right.items() if k not in read} | {k: v for k, v in left.items() if k in read}
    assert selectors.matches(selector, mixed) == selectors.matches(selector, left)


@given(
    st.lists(
        st.tuples(_selectors, st.integers(1, 3), st.sampled_from(["fixed", "linear", None])), max_size=4
    ),
    st.lists(_label_maps, max_size=25),
)
def test_assignment_matches_each_node_against_each_selector(
    declared: list[tuple[LabelSelector, int, str | None]], labels: list[dict[str, str]]
) -> None:
    """Grouped matching gives every node the compartment a node-by-node evaluation of the rule gives:
    among the selectors matching it, the safest strategy, then the smallest ceiling over every node
    the selector matches, then the name; no match: the default."""
    strategies = {
        "fixed": Strategy(fixed=FixedStrategy()),
        "linear": Strategy(linear=LinearStrategy()),
        None: None,
    }
    compartments = [
        Compartment(name=f"c{i}", selector=sel, budget=PolicyBudget(count=count), strategy=strategies[kind])
        for i, (sel, count, kind) in enumerate(declared)
    ]
    nodes = [NodeRef(f"n{i}", lab) for i, lab in enumerate(labels)]
    result = resolve_compartments(nw(deployment_policy="p"), policy=pol(*compartments), nodes=nodes)
    assert isinstance(result, Compartments)
    matching = {n.name: [c for c in compartments if selectors.matches(c.selector, n.labels)] for n in nodes}
    totals = {c.name: sum(c in found for found in matching.values()) for c in compartments}
    kinds = {"fixed": StrategyKind.FIXED, "linear": StrategyKind.LINEAR, None: StrategyKind.NONE}

    def safety(c: Compartment) -> tuple[int, int, str]:
        kind = kinds[next((k for k, v in strategies.items() if v == c.strategy), None)]
        return (int(kind), ceiling_for(BudgetSpec(count=c.budget.count), max(1, totals[c.name])), c.name)

    for node in nodes:
        found = matching[node.name]
        assert result.assignment[node.name] == (min(found, key=safety).name if found else DEFAULT)
