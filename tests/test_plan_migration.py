"""Translation of the reference operator's objects and node state (nodewright.plan.migration).

The promises checked here: reference manifests translate into objects our validation accepts; fields we
do not know are reported, never silently lost; a package the reference recorded complete is complete
for our planner (no pod for it), anything else is never taken for complete; a reference cordon is handed
over only when the reference holds it; malformed state is reported, never crashes, never completes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants, nodestate
from nodewright.api.models import NodeWright
from nodewright.api.nodestate import PackageStage, PackageState
from nodewright.api.validation import validate_deploymentpolicy, validate_nodewright
from nodewright.plan import migration as m
from nodewright.plan.node import node_complete, package_complete
from tests.api_corpus import sample_documents


def _skyhook(packages: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": m.REFERENCE_API_VERSION,
        "kind": "Skyhook",
        "metadata": {"name": "stack", "annotations": {}},
        "spec": {"nodeSelectors": {"matchLabels": {"role": "gpu"}}, "packages": packages, **spec},
    }


PACKAGES: dict[str, Any] = {
    "plain": {"version": "1.0.0", "image": "ghcr.io/x/plain", "configMap": {"a.conf": "x=1"}},
    "kernel": {"version": "2.1.0", "image": "ghcr.io/x/kernel", "interrupt": {"type": "reboot"}},
}


def _model(packages: dict[str, Any] | None = None, **spec: Any) -> NodeWright:
    t = m.translate_skyhook(_skyhook(packages or PACKAGES, **spec))
    assert t.ok, t.findings
    return NodeWright.model_validate(t.manifest)


def _node_state(entries: dict[str, dict[str, Any]]) -> str:
    return json.dumps(
        {
            key: {"name": key.split("|")[0], "version": key.split("|")[1], "image": "img", "restarts": 0, **v}
            for key, v in entries.items()
        }
    )


def _translate(
    entries: dict[str, dict[str, Any]] | str,
    *,
    model: NodeWright | None = None,
    cordon: bool = False,
    unschedulable: bool = False,
    **kwargs: Any,
) -> m.NodeTranslation:
    annotations = {
        m.node_state_annotation("stack"): entries if isinstance(entries, str) else _node_state(entries)
    }
    if cordon:
        annotations[m.cordon_annotation("stack")] = "true"
    return m.translate_node_state(
        node="n1",
        skyhook="stack",
        nodewright=model or _model(),
        annotations=annotations,
        unschedulable=unschedulable,
        **kwargs,
    )


# ----------------------------------------------------------------------------------------------------
# Objects


@pytest.mark.parametrize(
    "label,doc", sample_documents(reference=True), ids=lambda v: v if isinstance(v, str) else ""
)
def test_reference_samples_translate_into_valid_objects(label: str, doc: dict[str, Any]) -> None:
    t = m.translate_skyhook(doc) if doc["kind"] == "Skyhook" else m.translate_policy(doc)
    assert t.ok, (label, [str(f) for f in t.findings])
    assert t.manifest is not None
    assert t.manifest["apiVersion"] == constants.API_VERSION
    validate = validate_nodewright if doc["kind"] == "Skyhook" else validate_deploymentpolicy
    assert validate(t.manifest).ok
    assert (
        t.manifest["metadata"]["annotations"][m.MIGRATED_FROM] == f"{doc['kind']}/{doc['metadata']['name']}"
    )
    assert not t.dropped


def test_pause_and_disable_annotations_become_ours_and_bookkeeping_is_reported() -> None:
    doc = _skyhook(PACKAGES)
    doc["metadata"]["annotations"] = {
        m.REFERENCE_PAUSE: "true",
        m.REFERENCE_DISABLE: "false",
        "skyhook.nvidia.com/version": "v0.15.0",
        "team": "infra",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
    }
    t = m.translate_skyhook(doc)
    assert t.manifest is not None
    annotations = t.manifest["metadata"]["annotations"]
    assert annotations[constants.ANNOTATION_PAUSE] == "true"
    assert constants.ANNOTATION_DISABLE not in annotations
    assert annotations["team"] == "infra"
    assert not any(k.startswith(m.REFERENCE_PREFIX) for k in annotations)
    assert "kubectl.kubernetes.io/last-applied-configuration" not in annotations
    assert [f.path for f in t.findings] == ["metadata.annotations[skyhook.nvidia.com/version]"]


def test_unknown_fields_are_reported_with_their_path_and_left_out() -> None:
    packages = {"plain": {**PACKAGES["plain"], "futureKnob": 3}}
    t = m.translate_skyhook(_skyhook(packages, fancyMode=True))
    assert t.ok and t.manifest is not None
    assert sorted(f.path for f in t.dropped) == ["spec.fancyMode", "spec.packages.plain.futureKnob"]
    assert "fancyMode" not in t.manifest["spec"]
    assert "futureKnob" not in t.manifest["spec"]["packages"]["plain"]


def test_nulls_are_unset_and_the_map_key_names_the_package() -> None:
    t = m.translate_skyhook(_skyhook(PACKAGES, interruptionBudget={"percent": 20, "count": None}))
    assert t.ok and t.manifest is not None
    assert t.manifest["spec"]["interruptionBudget"] == {"percent": 20}
    assert t.manifest["spec"]["packages"]["plain"]["name"] == "plain"
    assert not t.dropped


def test_an_image_tag_the_reference_ignored_is_dropped_with_a_note() -> None:
    t = m.translate_skyhook(_skyhook({"pk": {"version": "1.2.3", "image": "ghcr.io/x/p:latest"}}))
    assert t.ok and t.manifest is not None
    assert t.manifest["spec"]["packages"]["pk"]["image"] == "ghcr.io/x/p"
    assert [f.severity for f in t.findings] == ["note"]
    same = m.translate_skyhook(_skyhook({"pk": {"version": "1.2.3", "image": "ghcr.io/x/p:1.2.3"}}))
    assert (
        same.manifest is not None and same.manifest["spec"]["packages"]["pk"]["image"] == "ghcr.io/x/p:1.2.3"
    )
    port = m.translate_skyhook(_skyhook({"pk": {"version": "1.2.3", "image": "registry:5000/x/p"}}))
    assert (
        port.manifest is not None and port.manifest["spec"]["packages"]["pk"]["image"] == "registry:5000/x/p"
    )
    assert "first ':'" in port.findings[0].message


def test_an_object_our_validation_refuses_is_invalid_and_names_the_field() -> None:
    doc = _skyhook(PACKAGES)
    doc["metadata"]["name"] = "x" * 60  # our status label needs <= 56 characters
    t = m.translate_skyhook(doc)
    assert not t.ok and t.manifest is None
    assert any(f.path == "metadata.name" for f in t.invalid), t.findings
    missing = m.translate_skyhook({"metadata": {"name": "s"}})
    assert not missing.ok and missing.invalid[0].path == "spec"


def test_same_spec_ignores_defaults_the_api_server_adds() -> None:
    t = m.translate_skyhook(_skyhook(PACKAGES))
    assert t.manifest is not None
    stored = NodeWright.model_validate(t.manifest).to_json_dict()  # every default filled in
    assert m.same_spec("Skyhook", stored, t.manifest)
    stored["spec"]["priority"] = 7
    assert not m.same_spec("Skyhook", stored, t.manifest)


# ----------------------------------------------------------------------------------------------------
# Node state


def test_complete_reference_packages_are_complete_for_our_planner() -> None:
    model = _model()
    t = _translate(
        {
            "plain|1.0.0": {"stage": "config", "state": "complete"},
            "kernel|2.1.0": {"stage": "post-interrupt", "state": "complete"},
        },
        model=model,
    )
    assert t.state is not None
    assert t.complete == ("kernel|2.1.0", "plain|1.0.0") and not t.restarted
    assert node_complete(model, t.state)
    # What is written is what the operator reads back.
    assert nodestate.decode(nodestate.encode(t.state)) == t.state


def test_a_config_the_reference_deferred_is_not_taken_for_applied() -> None:
    model = _model()
    t = _translate(
        {"plain|1.0.0": {"stage": "config", "state": "complete"}},
        model=model,
        applied_configs={"plain|1.0.0": {"a.conf": "x=0"}},
    )
    assert t.state is not None
    assert not package_complete(t.state, "plain", model.spec.packages["plain"]), "the config change must run"


@pytest.mark.parametrize(
    "stage,state",
    [
        ("apply", "in_progress"),
        ("apply", "complete"),
        ("config", "complete"),  # the package has a reboot still to come
        ("interrupt", "skipped"),
        ("interrupt", "in_progress"),
        ("post-interrupt", "erroring"),
        ("config", "unknown"),
    ],
)
def test_a_package_in_flight_restarts_at_the_start_of_its_run(stage: str, state: str) -> None:
    model = _model()
    t = _translate({"kernel|2.1.0": {"stage": stage, "state": state}}, model=model)
    assert t.state is not None
    entry = t.state.entry("kernel", "2.1.0")
    assert entry is not None and (entry.stage, entry.state) == (PackageStage.APPLY, PackageState.PENDING)
    assert not package_complete(t.state, "kernel", model.spec.packages["kernel"])
    assert t.restarted == (f"kernel|2.1.0: apply (was {stage}/{state})",)


def test_a_complete_status_label_the_state_does_not_bear_out_is_reported() -> None:
    entries = {"kernel|2.1.0": {"stage": "config", "state": "complete"}}
    t = _translate(entries, reference_status="complete")
    assert t.restarted and [f.path for f in t.findings] == [f"metadata.labels[{m.status_key('stack')}]"]
    assert not _translate(entries, reference_status="in_progress").findings


def test_an_upgrade_in_flight_restarts_as_an_upgrade_and_keeps_the_old_version() -> None:
    t = _translate(
        {
            "plain|0.9.0": {"stage": "config", "state": "complete"},
            "plain|1.0.0": {"stage": "upgrade", "state": "in_progress"},
        }
    )
    assert t.state is not None
    new, old = t.state.entry("plain", "1.0.0"), t.state.entry("plain", "0.9.0")
    assert new is not None and new.stage == PackageStage.UPGRADE and new.state == PackageState.PENDING
    assert old is not None and old.state == PackageState.COMPLETE and t.markers == ("plain|0.9.0",)


def test_config_complete_is_final_when_the_last_config_change_had_no_config_interrupt() -> None:
    packages = {
        "kernel": {
            **PACKAGES["kernel"],
            "configMap": {"a.conf": "1", "b.sh": "2"},
            "configInterrupts": {"*.sh": {"type": "reboot"}},
        }
    }
    model = _model(packages)
    done = {"kernel|2.1.0": {"stage": "config", "state": "complete"}}
    assert _translate(done, model=model, config_updates={"kernel": ["a.conf"]}).complete == ("kernel|2.1.0",)
    assert _translate(done, model=model, config_updates={"kernel": ["b.sh"]}).restarted
    assert _translate(done, model=model).restarted


def test_uninstall_in_flight_reruns_the_uninstall_or_reinstalls() -> None:
    wanted = {"plain": {**PACKAGES["plain"], "uninstall": {"enabled": True, "apply": True}}}
    again = _translate({"plain|1.0.0": {"stage": "uninstall", "state": "in_progress"}}, model=_model(wanted))
    assert again.state is not None
    entry = again.state.entry("plain", "1.0.0")
    assert entry is not None and entry.state == PackageState.COMPLETE and entry.stage == PackageStage.CONFIG
    cancelled = _translate({"plain|1.0.0": {"stage": "uninstall", "state": "erroring"}})
    assert cancelled.state is not None
    entry = cancelled.state.entry("plain", "1.0.0")
    assert entry is not None and (entry.stage, entry.state) == (PackageStage.APPLY, PackageState.PENDING)
    gone = _translate({"plain|1.0.0": {"stage": "uninstall-interrupt", "state": "complete"}})
    assert gone.state is not None and gone.state.entry("plain", "1.0.0") is None
    assert gone.uninstalled == ("plain|1.0.0",)


def test_packages_no_longer_in_the_spec_stay_as_inert_markers() -> None:
    t = _translate({"old-tool|3.0.0": {"stage": "apply", "state": "in_progress"}})
    assert t.state is not None and t.markers == ("old-tool|3.0.0",)
    entry = t.state.entry("old-tool", "3.0.0")
    assert entry is not None and entry.state == PackageState.COMPLETE


@pytest.mark.parametrize(
    "cordon,unschedulable,handed_over",
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_the_cordon_is_handed_over_only_when_the_reference_holds_it(
    cordon: bool, unschedulable: bool, handed_over: bool
) -> None:
    t = _translate(
        {"kernel|2.1.0": {"stage": "interrupt", "state": "in_progress"}},
        cordon=cordon,
        unschedulable=unschedulable,
    )
    assert t.state is not None
    assert t.state.cordoned is handed_over and t.cordon_handed_over is handed_over


def test_a_cordon_without_package_state_is_still_handed_over() -> None:
    t = m.translate_node_state(
        node="n1",
        skyhook="stack",
        nodewright=_model(),
        annotations={m.cordon_annotation("stack"): "true"},
        unschedulable=True,
    )
    assert t.state is not None and t.state.cordoned and not t.state.packages


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        json.dumps({"plain": {"stage": "apply", "state": "complete"}}),
        json.dumps({"plain|1.0.0": {"stage": "bake", "state": "complete"}}),
        json.dumps({"plain|1.0.0": {"stage": "config", "state": "done"}}),
        json.dumps({"plain|1.0.0": {"name": "other", "stage": "config", "state": "complete"}}),
        json.dumps({"plain|1.0.0": {"stage": "config", "state": "complete", "restarts": -1}}),
        json.dumps({"plain|1.0.0": "complete"}),
    ],
)
def test_malformed_reference_state_is_reported_and_nothing_is_written(text: str) -> None:
    t = _translate(text, cordon=True, unschedulable=True)
    assert t.state is None and t.malformed and not t.cordon_handed_over
    assert "cordon is kept" in t.findings[-1].message


# ----------------------------------------------------------------------------------------------------
# Properties

_stages = st.sampled_from(
    ["apply", "config", "upgrade", "interrupt", "post-interrupt", "uninstall", "uninstall-interrupt"]
)
_states = st.sampled_from(["complete", "in_progress", "skipped", "erroring", "unknown"])
_reference_entries = st.dictionaries(
    st.sampled_from(["plain|1.0.0", "plain|0.5.0", "kernel|2.1.0", "kernel|3.0.0", "gone|1.0.0"]),
    st.fixed_dictionaries({"stage": _stages, "state": _states}),
    max_size=5,
)


@given(entries=_reference_entries, cordon=st.booleans(), unschedulable=st.booleans())
def test_only_what_the_reference_finished_is_complete_for_us(
    entries: dict[str, dict[str, Any]], cordon: bool, unschedulable: bool
) -> None:
    model = _model()
    t = _translate(entries, model=model, cordon=cordon, unschedulable=unschedulable)
    assert t.state is not None
    assert nodestate.decode(nodestate.encode(t.state)) == t.state
    for name, pkg in model.spec.packages.items():
        finished = entries.get(f"{name}|{pkg.version}")
        final = "post-interrupt" if pkg.interrupt else "config"
        reference_complete = (
            finished is not None
            and finished["state"] == "complete"
            and finished["stage"]
            in (
                final,
                "post-interrupt",
            )
        )
        if package_complete(t.state, name, pkg):
            assert reference_complete, (name, entries)
        elif reference_complete:
            pytest.fail(f"{name} was complete in the reference but not for us: {entries}")
    assert t.state.cordoned == (cordon and unschedulable)


@given(
    text=st.one_of(
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=3),
            max_leaves=12,
        ).map(json.dumps),
    )
)
def test_any_annotation_text_is_translated_or_reported_never_crashes(text: str) -> None:
    t = _translate(text)
    if t.state is None:
        assert t.malformed
    else:
        assert not t.malformed


@given(
    spec=st.dictionaries(
        st.sampled_from(["priority", "serial", "sequencing", "runtimeRequired", "unknownThing", "packages"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-3, 300),
            st.text(max_size=6),
            st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
        ),
        max_size=6,
    )
)
def test_any_skyhook_spec_translates_or_is_reported_never_crashes(spec: dict[str, Any]) -> None:
    t = m.translate_skyhook({"metadata": {"name": "s"}, "spec": spec})
    if t.ok:
        assert t.manifest is not None and validate_nodewright(t.manifest).ok
    else:
        assert t.invalid


# ----------------------------------------------------------------------------------------------------
# Taints and labels


REF = m.TaintSpec.parse(m.DEFAULT_REFERENCE_TAINT)
OURS = m.TaintSpec.parse("nodewright.io/runtime-required=true:NoSchedule")


def test_the_runtime_taint_is_handed_over_on_nodes_a_runtime_required_nodewright_selects() -> None:
    model = _model(runtimeRequired=True)
    other = {"key": "gpu", "effect": "NoExecute"}
    extras = m.translate_node_extras(
        labels={"role": "gpu", m.REFERENCE_IGNORE_LABEL: "true"},
        annotations={m.REFERENCE_AUTO_TAINT_PREFIX + REF.key: "true"},
        taints=[other, REF.to_json()],
        runtime_required=[model],
        reference_taint=REF,
        our_taint=OURS,
    )
    assert extras.taints == (other, OURS.to_json())
    assert extras.annotations == ((constants.AUTO_TAINT_ANNOTATION, "true"),)
    assert extras.labels == ((constants.LABEL_IGNORE, "true"),)
    elsewhere = m.translate_node_extras(
        labels={"role": "cpu"},
        annotations={},
        taints=[REF.to_json()],
        runtime_required=[model],
        reference_taint=REF,
        our_taint=OURS,
    )
    assert elsewhere.taints is None and "left" in elsewhere.findings[0].message


def test_taint_syntax_errors_name_the_taint() -> None:
    with pytest.raises(ValueError, match="key\\[=value\\]"):
        m.TaintSpec.parse("nokind")
    assert m.TaintSpec.parse("k:NoSchedule").to_json() == {"key": "k", "effect": "NoSchedule"}
