"""`kubectl nodewright` as a command line: fast start-up, kubectl's conventions, completion, exit codes,
and the node writes (reset, retry) against an in-memory API server (`tests.kubefake`): what they
change, what they refuse, and that every write is guarded by the node's resourceVersion.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodewright.api.nodestate import decode
from nodewright.cli import commands
from nodewright.cli.main import build_parser, main, split_command
from nodewright.cli.plugin import common, completion_verbs, node_verbs
from nodewright.kube.client import KubeClient
from tests.kubefake import NODES_C, FakeKube, pods_c

JSON = dict[str, Any]


def test_help_loads_neither_the_client_stack_nor_other_commands() -> None:
    code = (
        "import sys\n"
        "from nodewright.cli.main import build_parser\n"
        "build_parser(None, everything=False).format_help()\n"
        "build_parser('why', plugin_only=True).format_help()\n"
        "heavy = [m for m in ('aiohttp', 'opentelemetry', 'pydantic', 'nodewright.controller', 'yaml')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "", f"imported for --help: {done.stdout}"


def test_the_plugin_offers_the_day2_verbs_only() -> None:
    parser = build_parser(prog="kubectl nodewright", plugin_only=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    offered = set(sub.choices)
    assert {
        "pause",
        "resume",
        "disable",
        "enable",
        "status",
        "node",
        "package",
        "policy",
        "why",
        "watch",
        "plan",
    } <= offered
    assert not offered & {"operator", "webhook", "demo", "sim"}
    assert offered == {c.name for c in commands.COMMANDS if c.plugin}


def _verb_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out.append(((*path, name), child))
                out.extend(_verb_parsers(child, (*path, name)))
    return out


def test_every_plugin_verb_documents_examples_and_takes_the_cluster_flags() -> None:
    parser = build_parser(prog="kubectl nodewright", plugin_only=True, everything=True)
    mine = {c.name for c in commands.COMMANDS if c.module.startswith("nodewright.cli.plugin.")}
    authoring = {("package", n) for n in ("init", "validate", "run", "build")}
    for path, verb in _verb_parsers(parser):
        if path[0] not in mine or path in authoring or path in {("node",), ("policy",), ("package",)}:
            continue
        text = verb.format_help()
        assert "examples:" in text, path
        if path != ("completion",):
            for flag in ("--kubeconfig", "--context", "--namespace", "--request-timeout"):
                assert flag in text, (path, flag)
        writes = {
            ("pause",), ("resume",), ("disable",), ("enable",), ("node", "ignore"), ("node", "unignore"),
            ("node", "reset"), ("node", "retry"), ("package", "rerun"), ("policy", "reset"),
        }  # fmt: skip
        if path in writes:
            assert "--dry-run" in text, path
        if path in {("node", "reset"), ("node", "retry"), ("package", "rerun"), ("policy", "reset")}:
            assert "--yes" in text, path


def test_global_flags_may_come_before_the_verb() -> None:
    assert split_command(["--context", "prod", "-n", "ops", "status", "nw"]) == (
        "status",
        ["status", "--context", "prod", "-n", "ops", "nw"],
    )
    assert split_command(["--kubeconfig=/k", "why", "n1"]) == ("why", ["why", "--kubeconfig=/k", "n1"])
    assert split_command(["--help"]) == (None, ["--help"])


def test_completion_walks_the_parser() -> None:
    parser = build_parser(prog="kubectl nodewright", plugin_only=True, everything=True)
    assert completion_verbs.candidates(parser, ["no"]) == (["node"], None)
    assert completion_verbs.candidates(parser, ["node", "re"]) == (["reset", "retry"], None)
    flags, _ = completion_verbs.candidates(parser, ["node", "reset", "n1", "--u"])
    assert flags == ["--uncordon"]
    assert completion_verbs.candidates(parser, ["why", "-o", "j"]) == (["json"], None)
    assert completion_verbs.candidates(parser, ["why", ""]) == ([], "node")
    assert completion_verbs.candidates(parser, ["why", "n1", ""]) == ([], "nodewright")
    assert completion_verbs.candidates(parser, ["package", "logs", "nw", "p", "--stage", "post"]) == (
        ["post-interrupt"],
        None,
    )
    assert completion_verbs.candidates(parser, ["package", "logs", "nw", "p", "--node", ""]) == ([], "node")
    assert completion_verbs.candidates(parser, ["--context", "x", "status", ""])[1] == "nodewright"
    assert completion_verbs.candidates(parser, ["--kubeconfig", "k", "node", "re"]) == (
        ["reset", "retry"],
        None,
    )


def test_completion_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"], prog="kubectl nodewright", plugin_only=True) == 0
    script = capsys.readouterr().out
    assert (
        "kubectl-nodewright __complete" in script and "complete -o default -F _kubectl_nodewright" in script
    )
    assert main(["completion", "zsh"]) == 0
    assert "bashcompinit" in capsys.readouterr().out


def test_exit_codes_for_usage_config_and_unreachable_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["why"], prog="kubectl nodewright", plugin_only=True)
    assert exc.value.code == common.USAGE
    assert main(["status", "--kubeconfig", str(tmp_path / "missing")]) == common.USAGE
    assert "cannot read kubeconfig" in capsys.readouterr().err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    assert main(["status", "--kubeconfig", str(kubeconfig), "--request-timeout", "2"]) == common.FAILED
    err = capsys.readouterr().err
    assert (
        err.startswith("nodewright status: cannot reach the API server")
        and err[-1] == "\n"
        and err.count("\n") == 1
    )


# ----------------------------------------------------------------------------------------------------
# Node writes against an in-memory API server


STATE = {
    "v": 1,
    "cd": True,
    "p": {
        "a|1.0.0": {"s": "apply", "t": "erroring", "n": 3, "e": "boom", "fu": "1/0/2026-01-01T00:00:00Z"},
        "b|2.0.0": {"s": "config", "t": "complete"},
    },
}


def _node(state: JSON | None = None, *, admission: bool = True, unschedulable: bool = True) -> JSON:
    annotations = {}
    if state is not None:
        annotations["nodewright.io/state.nw"] = json.dumps(state)
    if admission:
        annotations["nodewright.io/batch.nw"] = json.dumps(
            {"c": "__default__", "b": 1, "o": 0, "f": "x", "at": "2026-01-01T00:00:00Z", "d": True}
        )
    return {"metadata": {"name": "n1", "annotations": annotations}, "spec": {"unschedulable": unschedulable}}


def _stored(kube: FakeKube) -> JSON:
    node = kube.get(NODES_C, "n1")
    assert node is not None
    return node


async def _run(verb: Any, kube: FakeKube, **args: Any) -> int:
    defaults: JSON = {
        "namespace": "nodewright-system",
        "dry_run": "none",
        "yes": True,
        "output": "json",
        "prog": "t",
    }
    ns = argparse.Namespace(**{**defaults, **args})
    async with KubeClient(kube.config(), max_retries=0) as client:
        try:
            result: int = await verb(common.Session(ns, client))
        except common.PluginError as exc:
            return exc.code
        return result


@pytest.fixture
async def kube() -> Any:
    server = await FakeKube().start()
    try:
        yield server
    finally:
        await server.stop()


async def test_reset_refuses_a_cordon_only_the_state_knows_unless_told_to_uncordon(kube: FakeKube) -> None:
    kube.put(NODES_C, _node(STATE))
    assert (
        await _run(node_verbs._reset, kube, node="n1", nodewright="nw", package=None, uncordon=False)
        == common.REFUSED
    )
    assert "nodewright.io/state.nw" in _stored(kube)["metadata"]["annotations"]
    assert (
        await _run(node_verbs._reset, kube, node="n1", nodewright="nw", package=None, uncordon=True)
        == common.OK
    )
    after = _stored(kube)
    assert "nodewright.io/state.nw" not in after["metadata"]["annotations"]
    assert after["spec"]["unschedulable"] is False, "uncordoned in the same write"
    assert "nodewright.io/batch.nw" in after["metadata"]["annotations"], "the admission is the rollout's"


async def test_reset_of_one_package_keeps_the_rest_and_refuses_while_its_pod_runs(kube: FakeKube) -> None:
    kube.put(NODES_C, _node(STATE))
    pod = {
        "metadata": {
            "name": "p1",
            "labels": {
                "nodewright.io/nodewright": "nw",
                "nodewright.io/package": "a",
                "nodewright.io/node": "n1",
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    kube.put(pods_c("nodewright-system"), pod)
    assert (
        await _run(node_verbs._reset, kube, node="n1", nodewright="nw", package="a", uncordon=False)
        == common.REFUSED
    )
    kube.remove(pods_c("nodewright-system"), "p1")
    assert (
        await _run(node_verbs._reset, kube, node="n1", nodewright="nw", package="zzz", uncordon=False)
        == common.NOT_FOUND
    )
    assert (
        await _run(node_verbs._reset, kube, node="n1", nodewright="nw", package="a", uncordon=False)
        == common.OK
    )
    state = decode(_stored(kube)["metadata"]["annotations"]["nodewright.io/state.nw"])
    assert [e.name for e in state.packages] == ["b"] and state.cordoned, "only package a's entry went"


async def test_writes_are_refused_when_the_node_changed_since_it_was_read(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.put(NODES_C, _node(STATE))
    real = node_verbs._read_node

    async def stale(session: common.Session, name: str) -> JSON:
        node = await real(session, name)
        kube.put(NODES_C, {**_stored(kube)})  # the operator writes meanwhile: a new resourceVersion
        return node

    monkeypatch.setattr(node_verbs, "_read_node", stale)
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package=None) == common.REFUSED
    assert "nodewright.io/batch.nw" in _stored(kube)["metadata"]["annotations"]


async def test_retry_removes_the_admission_and_only_for_erroring_packages(kube: FakeKube) -> None:
    two = {"v": 1, "p": {**STATE["p"], "c|1.0.0": {"s": "apply", "t": "erroring", "n": 1}}}  # type: ignore[dict-item]
    kube.put(NODES_C, _node(two))
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package="b") == common.NOT_FOUND
    # a and c are erroring: a fresh admission restarts both, so retrying a alone is refused.
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package="a") == common.REFUSED
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package=None) == common.OK
    assert "nodewright.io/batch.nw" not in _stored(kube)["metadata"]["annotations"]
    assert decode(_stored(kube)["metadata"]["annotations"]["nodewright.io/state.nw"]) == decode(
        json.dumps(two)
    )
    # Already waiting for a batch: nothing to do, and said so.
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package=None) == common.OK
    kube.put(NODES_C, _node({"v": 1, "p": {"b|2.0.0": {"s": "config", "t": "complete"}}}))
    assert await _run(node_verbs._retry, kube, node="n1", nodewright="nw", package=None) == common.REFUSED


async def test_a_client_dry_run_sends_no_write(kube: FakeKube) -> None:
    kube.put(NODES_C, _node(STATE))
    before = len([r for r in kube.requests if r.method == "PATCH"])
    assert (
        await _run(
            node_verbs._reset, kube, node="n1", nodewright="nw", package="a", uncordon=False, dry_run="client"
        )
        == common.OK
    )
    assert len([r for r in kube.requests if r.method == "PATCH"]) == before
    assert "a|1.0.0" in _stored(kube)["metadata"]["annotations"]["nodewright.io/state.nw"]


def test_node_status_text_names_each_nodewrights_hold_and_packages() -> None:
    def nodewright(name: str, **over: Any) -> JSON:
        base: JSON = {
            "nodewright": name,
            "selected": True,
            "status": "in_progress",
            "stateError": None,
            "cordonedByThis": True,
            "admission": {"compartment": "gpu", "batch": 2, "order": 7, "consumed": False, "at": "t"},
            "packages": [
                {
                    "package": "tuning",
                    "version": "1.0.0",
                    "stage": "config",
                    "state": "erroring",
                    "attempts": 3,
                    "error": "x" * 100,
                    "image": "ghcr.io/example/tuning:1.0.0",
                }
            ],
            "why": {"reason": "InProgress", "summary": "tuning:1.0.0 config erroring"},
        }
        return {**base, **over}

    doc = {
        "node": "n1",
        "unschedulable": True,
        "ignored": False,
        "nodewrights": [
            nodewright("kernel"),
            nodewright("old", selected=False, status=None, admission=None, packages=[], why=None,
                       cordonedByThis=False, stateError="not JSON"),
        ],
    }  # fmt: skip
    text = node_verbs._render_node_status(doc, wide=False)
    lines = text.splitlines()
    assert lines[0] == "node n1: cordoned"
    assert "kernel: in_progress, cordoned by it, admitted batch 2 of gpu" in lines
    assert "  why: InProgress: tuning:1.0.0 config erroring" in lines
    assert "old: waiting (untouched) (no longer selected)" in lines
    assert "  state unreadable: not JSON" in lines
    assert "x" * 80 in text and "x" * 81 not in text and "ghcr.io/example" not in text
    wide = node_verbs._render_node_status(doc, wide=True)
    assert "x" * 100 in wide and "ghcr.io/example/tuning:1.0.0" in wide
    empty = node_verbs._render_node_status({**doc, "unschedulable": False, "nodewrights": []}, wide=False)
    assert empty == "node n1: schedulable\nno NodeWright selects this node or has state on it\n"
