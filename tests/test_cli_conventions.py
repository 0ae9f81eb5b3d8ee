"""The command line's contract (docs/plugin.md, "Exit codes"), run as users run it: `python -m
nodewright ...` in a subprocess against an in-memory API server (`tests.kubefake`).

Exit status 1 the API server unreachable or refusing, 2 usage (a bad kubeconfig too), 3 not found; a
failure is ONE line on stderr; stdout carries results only (never a library's debug line); a reader
that goes away (`| head`) ends the output quietly; `--request-timeout` bounds every call, retries
included.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import NODES_C, FakeKube, node
from tests.test_cli_operator import write_kubeconfig

REPO = Path(__file__).resolve().parent.parent
NODEWRIGHTS_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
POLICIES_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def one_line_error(self) -> str:
        assert self.err.endswith("\n") and self.err.count("\n") == 1, f"not one line: {self.err!r}"
        assert "Traceback" not in self.err
        return self.err


async def cli(*args: str, stdout: Any = asyncio.subprocess.PIPE) -> Ran:
    """`python -m nodewright ARGS`, with nothing of the machine's kubeconfig or proxies inherited."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and "proxy" not in k.lower()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodewright", *args,
        cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(proc.returncode, (out or b"").decode(), err.decode())


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubeconfig(tmp_path: Path, kube: FakeKube) -> str:
    return str(write_kubeconfig(tmp_path / "kubeconfig", kube.url))


def gated_nodewright(name: str = "gated") -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "deploymentPolicy": "pol",
            "packages": {"tune": {"version": "1.0.0", "image": "ghcr.io/x/tune"}},
        },
        "status": {"compartmentStatuses": {"canary": {"awaitingApproval": 1}, "zone-a": {"matched": 2}}},
    }


POLICY = {
    "apiVersion": "nodewright.io/v1alpha1",
    "kind": "DeploymentPolicy",
    "metadata": {"name": "pol"},
    "spec": {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
        "compartments": [
            {"name": "canary", "selector": {"matchLabels": {"c": "canary"}}, "budget": {"count": 1}},
            {"name": "zone-a", "selector": {"matchLabels": {"c": "a"}}, "budget": {"count": 1}},
            {"name": "zone-b", "selector": {"matchLabels": {"c": "b"}}, "budget": {"count": 1}},
        ],
    },
}


# ----------------------------------------------------------------------------------------------------
# Exit codes


async def test_a_kubeconfig_that_does_not_load_is_a_usage_error_for_every_reader(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    for args in (("consistency",), ("plan", "nw"), ("status",), ("version",)):
        ran = await cli(*args, "--kubeconfig", missing)
        assert ran.code == 2, (args, ran)
        assert "cannot read kubeconfig" in ran.one_line_error(), args
        assert ran.out == ""


async def test_an_unknown_nodewright_is_not_found(kube: FakeKube, kubeconfig: str) -> None:
    kube.put(NODES_C, node("n1"))
    for args in (("consistency", "nope"), ("plan", "nope"), ("approve", "nope"), ("status", "nope")):
        ran = await cli(*args, "--kubeconfig", kubeconfig)
        assert ran.code == 3, (args, ran)
        assert "'nope' not found" in ran.one_line_error(), (args, ran.err)
        assert ran.out == ""


async def test_approving_a_compartment_that_does_not_exist_is_not_found_and_writes_nothing(
    kube: FakeKube, kubeconfig: str
) -> None:
    kube.put(POLICIES_C, POLICY)
    kube.put(NODEWRIGHTS_C, gated_nodewright())
    ran = await cli("approve", "gated", "--compartment", "canray", "--kubeconfig", kubeconfig)
    assert ran.code == 3, ran
    err = ran.one_line_error()
    assert "no compartment 'canray'" in err and "canary" in err and "zone-b" in err, err
    assert kube.count("PATCH") == 0
    # A compartment of the policy that is not at a gate is nothing to do: exit 0, said so.
    ran = await cli("approve", "gated", "--compartment", "zone-b", "--kubeconfig", kubeconfig)
    assert ran.code == 0 and "no compartment in zone-b waits for approval" in ran.out, ran
    ran = await cli("approve", "gated", "--compartment", "canary", "--kubeconfig", kubeconfig)
    assert ran.code == 0 and "approved canary after batch 1" in ran.out, ran
    assert kube.count("PATCH") == 1


@pytest.mark.parametrize(
    "verb", [("status",), ("node", "list"), ("why", "n1"), ("consistency",), ("plan", "x")]
)
async def test_a_namespace_that_cannot_exist_is_a_usage_error(verb: tuple[str, ...]) -> None:
    ran = await cli(*verb, "-n", "Bad NS", "--kubeconfig", "/nonexistent")
    assert ran.code == 2, ran
    assert "'Bad NS' is not a valid name" in ran.one_line_error()


# ----------------------------------------------------------------------------------------------------
# stdout holds results only


async def test_retried_requests_print_no_debug_line_on_stdout(
    kube: FakeKube, kubeconfig: str, tmp_path: Path
) -> None:
    kube.put(NODES_C, node("n1"))
    kube.put(NODEWRIGHTS_C, gated_nodewright("nw"))
    kube.put(POLICIES_C, POLICY)
    runs = {
        "plan": ("plan", "nw"),
        "migrate": ("migrate",),
        "uninstall": ("uninstall", "--dry-run"),
        "consistency": ("consistency",),
    }
    for name, args in runs.items():
        # Two 503s on the first LIST: the client retries (and logs it at debug level), then succeeds.
        kube.fail("GET", "/", 503, times=2)
        ran = await cli(*args, "--kubeconfig", kubeconfig)
        assert all(f.times == 0 for f in kube.faults), f"{name}: the faults were not hit"
        kube.faults.clear()
        for stream in (ran.out, ran.err):
            assert "retrying request" not in stream and "[debug" not in stream, (name, ran)
        assert ran.code in (0, 1), (name, ran)


async def test_migrate_prints_its_plan_on_stdout_and_its_errors_on_stderr(
    kube: FakeKube, kubeconfig: str
) -> None:
    kube.put(NODEWRIGHTS_C, {"metadata": {"name": "stack"}, "spec": {"packages": {}}})
    kube.put(
        ("apis/skyhook.nvidia.com/v1alpha1", "", "skyhooks"),
        {"metadata": {"name": "stack"}, "spec": {"packages": {"p": {"version": "1.0.0", "image": "x/p"}}}},
    )
    ran = await cli("migrate", "--apply", "--kubeconfig", kubeconfig)
    assert ran.code == 1, ran
    assert "error" not in ran.out, ran.out
    assert ran.err.startswith("nodewright migrate: error: refusing --apply: Skyhook stack cannot be"), ran.err
    assert "Skyhook stack: cannot be translated" in ran.out, ran.out


# ----------------------------------------------------------------------------------------------------
# Deadlines


async def test_request_timeout_bounds_each_call_with_its_retries(tmp_path: Path) -> None:
    """An API server that accepts connections and never answers: with --request-timeout 1, the first
    call gives up after one attempt (before: up to six attempts of the full timeout each)."""
    connections = 0
    held: list[asyncio.StreamWriter] = []

    async def hang(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        held.append(writer)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        path = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
        for args in (("plan", "nw"), ("consistency",), ("status",)):
            connections = 0
            ran = await cli(*args, "--kubeconfig", str(path), "--request-timeout", "1")
            assert ran.code == 1, (args, ran)
            assert "cannot reach the API server" in ran.one_line_error()
            assert connections == 1, (args, connections)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


# ----------------------------------------------------------------------------------------------------
# A reader that goes away


async def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already exited: the first write fails with EPIPE
    try:
        ran = await cli(
            "package", "build", str(REPO / "packages" / "shell"), "--base", "scratch",
            "-o", str(tmp_path / "oci"), stdout=write_end,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert ran.code == 141, ran
    assert "Traceback" not in ran.err and "BrokenPipe" not in ran.err, ran.err
    assert (tmp_path / "oci" / "index.json").is_file(), "the work was done; only its output was cut"


# ----------------------------------------------------------------------------------------------------
# version


def deployment(name: str, component: str, image: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "nodewright",
                "app.kubernetes.io/component": component,
                **labels,
            },
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"image": image}]}}},
        "status": {"readyReplicas": 1},
    }


async def test_version_names_the_client_and_the_operator_and_webhook_in_the_namespace(
    kube: FakeKube, kubeconfig: str
) -> None:
    from nodewright.cli.plugin.version_verbs import client_version

    ran = await cli("version", "--client")
    assert ran.code == 0 and ran.out == f"Client Version: {client_version()}\n", ran
    ran = await cli("version", "--kubeconfig", kubeconfig)
    assert ran.code == 3, ran
    assert "no NodeWright operator Deployment in namespace 'nodewright-system'" in ran.one_line_error()
    assert ran.out.startswith("Client Version: ")
    deployments = ("apis/apps/v1", "ops", "deployments")
    kube.put(
        deployments,
        deployment(
            "nw-nodewright",
            "operator",
            "ghcr.io/x/nodewright:0.1.0",
            **{"app.kubernetes.io/version": "0.1.0"},
        ),
    )
    kube.put(
        deployments,
        deployment("nw-nodewright-webhook", "webhook", "registry.local/nw:0.2.0-rc1@sha256:" + "a" * 64),
    )
    kube.put(deployments, {"metadata": {"name": "other", "labels": {"app": "x"}}, "spec": {}})
    ran = await cli("version", "--kubeconfig", kubeconfig, "-n", "ops", "-o", "json")
    assert ran.code == 0, ran
    doc = json.loads(ran.out)
    assert doc["operator"] == {
        "version": "0.1.0", "deployment": "ops/nw-nodewright", "image": "ghcr.io/x/nodewright:0.1.0",
        "replicas": 2, "readyReplicas": 1,
    }  # fmt: skip
    assert doc["webhook"]["version"] == "0.2.0-rc1", "no version label: the image tag"
    ran = await cli("version", "--kubeconfig", kubeconfig, "-n", "ops")
    assert "Operator Version: 0.1.0 (deployment ops/nw-nodewright, 1/2 ready" in ran.out, ran.out
