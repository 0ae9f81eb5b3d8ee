"""`nodewright operator` start-up, run as a real subprocess (`python -m nodewright operator`):

- resources that are not usable (a port in use, a kubeconfig that does not load, credentials the API
  server rejects, missing RBAC, CRDs or namespace) end with one line on stderr naming the flag or
  object and what to do, exit status 2, no traceback and no "Unclosed client session";
- a start while the API server is unreachable waits (with or without leader election): one log line
  per attempt with the error and the next delay, `/readyz` 503 saying what it waits for, `/healthz`
  200, and SIGTERM ends it cleanly (exit 0);
- against the fake API server (tests/kubefake.py) a start that meets 503s waits, then runs.

The backoff itself (`until_reachable`) is tested in-process on a fake clock.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from structlog.testing import capture_logs

from nodewright.controller.manager import Manager, describe_error, is_outage, until_reachable
from nodewright.kube.client import KubeClient
from nodewright.kube.clock import FakeClock
from nodewright.kube.config import ClusterConfig, NoAuth
from nodewright.kube.resources import ApiError, NotFound
from tests.kubefake import FakeKube, status_body
from tests.kubeutil import eventually

REPO = Path(__file__).resolve().parents[1]
NOBODY = "http://127.0.0.1:1"  # nothing listens on port 1: connection refused at once
API_GROUP_PATH = "/apis/nodewright.io/v1alpha1"


# ----------------------------------------------------------------------------------------------------
# Helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def occupied_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def write_kubeconfig(path: Path, server: str, *, token: str = "test-token", **cluster: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": {"token": token}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Exited:
    code: int
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Unclosed" not in stderr, stderr


def operator_argv(kubeconfig: Path, *extra: str, health: str = "0") -> list[str]:
    return [
        sys.executable, "-m", "nodewright", "operator", f"--kubeconfig={kubeconfig}",
        f"--health-probe-bind-address={health}", "--metrics-bind-address=0", "--log-format=json", *extra,
    ]  # fmt: skip


async def run_to_exit(argv: list[str], *, within: float = 60.0) -> Exited:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        _out, err = await proc.communicate()
        raise AssertionError(f"still running after {within}s:\n{err.decode()}") from None
    assert proc.returncode is not None
    return Exited(proc.returncode, err.decode(errors="replace"))


class Running:
    """A started operator whose stderr (JSON log lines) is collected as it arrives."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    async def wait_for(self, predicate: Callable[[], bool], *, within: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + within
        while not predicate():
            if self.proc.returncode is not None:
                await self._reader
                raise AssertionError(
                    f"exited ({self.proc.returncode}) before {what}:\n" + "\n".join(self.lines)
                )
            if loop.time() > end:
                raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(self.lines))
            await asyncio.sleep(0.05)

    async def terminate(self, *, within: float = 30.0) -> Exited:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), within)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        await self._reader
        assert self.proc.returncode is not None
        return Exited(self.proc.returncode, "\n".join(self.lines))


@contextlib.asynccontextmanager
async def running(argv: list[str]) -> AsyncIterator[Running]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    op = Running(proc)
    try:
        yield op
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def http_get(port: int, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as resp,
    ):
        text = await resp.text()
        with contextlib.suppress(ValueError):
            return resp.status, json.loads(text)
        return resp.status, text


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


def serve_discovery(kube: FakeKube) -> None:
    """The fake API server stores objects only; answer the two start-up probes like a real one."""
    kube.fail("GET", "/version", 200, body={"major": "1", "minor": "36"}, times=10_000)
    resources = [{"name": n} for n in ("nodewrights", "deploymentpolicies", "disruptionbudgets")]
    kube.fail(
        "GET", API_GROUP_PATH, 200, body={"kind": "APIResourceList", "resources": resources}, times=10_000
    )


# ----------------------------------------------------------------------------------------------------
# Start-up failures that waiting cannot fix: one line, exit 2


def test_a_crd_that_is_not_installed_is_named() -> None:
    from nodewright.cli.operator_cmd import missing_resources

    listed = (
        '{"kind": "APIResourceList", "resources": [{"name": "nodewrights"}, {"name": "deploymentpolicies"}]}'
    )
    assert missing_resources(listed) == ["disruptionbudgets"]
    assert missing_resources("not json") == [] and missing_resources('{"kind": "Status"}') == []


@pytest.mark.parametrize("flag", ["--health-probe-bind-address", "--metrics-bind-address"])
async def test_port_in_use(flag: str, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", NOBODY)
    with occupied_port() as port:
        argv = [a for a in operator_argv(kubeconfig) if not a.startswith(flag)]
        exited = await run_to_exit([*argv, f"{flag}=127.0.0.1:{port}"])
    assert exited.code == 2, exited.stderr
    assert len(exited.lines) == 1, exited.stderr
    assert exited.lines[0].startswith(f"nodewright operator: {flag} 127.0.0.1:{port}: cannot listen")
    assert "choose a free port" in exited.lines[0]
    assert_clean(exited.stderr)


@pytest.mark.parametrize(
    ("cluster", "names"),
    [
        (
            {"certificate-authority-data": base64.b64encode(b"not a certificate").decode()},
            "certificate-authority",
        ),
        ({"certificate-authority-data": "!!! not base64 !!!"}, "certificate-authority-data"),
        ({"certificate-authority": "/nonexistent/ca.crt"}, "/nonexistent/ca.crt"),
    ],
)
async def test_kubeconfig_with_a_corrupt_ca(cluster: dict[str, str], names: str, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", **cluster)
    exited = await run_to_exit(operator_argv(kubeconfig))
    assert exited.code == 2, exited.stderr
    assert len(exited.lines) == 1, exited.stderr
    assert str(kubeconfig) in exited.lines[0] and names in exited.lines[0]
    assert_clean(exited.stderr)


async def test_missing_kubeconfig(tmp_path: Path) -> None:
    exited = await run_to_exit(operator_argv(tmp_path / "nope"))
    assert exited.code == 2
    assert exited.lines == [
        f"nodewright operator: cannot read kubeconfig {tmp_path / 'nope'}: No such file or directory"
    ]


def _namespace_missing(kube: FakeKube) -> str:
    serve_discovery(kube)
    body = status_body(404, "NotFound", 'namespaces "nodewright-system" not found')
    body["details"] = {"name": "nodewright-system", "kind": "namespaces"}
    kube.fail("POST", "/namespaces/nodewright-system/secrets", 404, body=body)
    return (
        "namespace 'nodewright-system' does not exist: create it (kubectl create namespace nodewright-system)"
    )


def _crds_missing(kube: FakeKube) -> str:
    kube.fail("GET", "/version", 200, body={"major": "1"})
    kube.fail("GET", API_GROUP_PATH, 404, body=status_body(404, "NotFound", "the server could not find it"))
    return "does not serve nodewright.io/v1alpha1: install the CRDs (kubectl apply --server-side -f"


def _token_rejected(kube: FakeKube) -> str:
    kube.fail("GET", "/version", 401, body=status_body(401, "Unauthorized", "Unauthorized"))
    return "rejected the credentials of kubeconfig"


def _secret_forbidden(kube: FakeKube) -> str:
    serve_discovery(kube)
    message = 'secrets "nodewright-pod-signing" is forbidden: User "x" cannot get resource "secrets"'
    kube.fail("GET", "/secrets/", 403, body=status_body(403, "Forbidden", message))
    return "forbidden (403: secrets"


@pytest.mark.parametrize(
    ("scenario", "leader_elect"),
    [
        (_namespace_missing, "--leader-elect"),
        (_namespace_missing, "--no-leader-elect"),
        (_crds_missing, "--leader-elect"),
        (_token_rejected, "--no-leader-elect"),
        (_secret_forbidden, "--leader-elect"),
    ],
    ids=["namespace-missing", "namespace-missing-no-election", "crds-missing", "token-rejected", "forbidden"],
)
async def test_api_answers_that_waiting_cannot_change(
    scenario: Callable[[FakeKube], str], leader_elect: str, kube: FakeKube, tmp_path: Path
) -> None:
    expected = scenario(kube)
    exited = await run_to_exit(operator_argv(write_kubeconfig(tmp_path / "kc", kube.url), leader_elect))
    assert exited.code == 2, exited.stderr
    assert len(exited.lines) == 1, exited.stderr
    assert exited.lines[0].startswith("nodewright operator: ") and expected in exited.lines[0], exited.stderr
    assert_clean(exited.stderr)


# ----------------------------------------------------------------------------------------------------
# Outages at start-up: wait, report, never exit


@pytest.mark.parametrize("leader_elect", ["--leader-elect", "--no-leader-elect"])
async def test_start_during_an_outage_waits_with_backoff(leader_elect: str, tmp_path: Path) -> None:
    health = free_port()
    argv = operator_argv(
        write_kubeconfig(tmp_path / "kc", NOBODY), leader_elect, health=f"127.0.0.1:{health}"
    )
    async with running(argv) as op:

        def attempts() -> list[dict[str, Any]]:
            return [e for e in op.events() if str(e.get("event", "")).startswith("API server unreachable")]

        await op.wait_for(lambda: len(attempts()) >= 3, within=30, what="three attempts")
        first, second, third = attempts()[:3]
        for event in (first, second, third):
            assert event["server"] == NOBODY and "Cannot connect to host 127.0.0.1:1" in event["error"]
            assert f"next try in {event['retry_in_seconds']:.1f} s" in event["event"]
        assert [e["attempt"] for e in (first, second, third)] == [1, 2, 3]
        assert 1.0 <= first["retry_in_seconds"] <= 2.0 and 2.0 <= second["retry_in_seconds"] <= 4.0
        status, body = await http_get(health, "/readyz")
        assert status == 503 and body["ready"] is False
        assert body["waitingFor"].startswith("GET /version")
        assert (await http_get(health, "/healthz"))[0] == 200
        exited = await op.terminate()
    assert exited.code == 0, exited.stderr
    assert_clean(exited.stderr)


async def test_start_meeting_503s_waits_then_runs(kube: FakeKube, tmp_path: Path) -> None:
    kube.fail(
        "GET", "/version", 503, body=status_body(503, "ServiceUnavailable", "etcd is not ready"), times=2
    )
    serve_discovery(kube)
    health = free_port()
    argv = operator_argv(
        write_kubeconfig(tmp_path / "kc", kube.url), "--no-leader-elect", health=f"127.0.0.1:{health}"
    )
    async with running(argv) as op:

        def logged(event: str) -> bool:
            return any(str(e.get("event", "")).startswith(event) for e in op.events())

        await op.wait_for(lambda: logged("caches synced"), within=60, what="caches synced")
        unreachable = [e for e in op.events() if str(e.get("event", "")).startswith("API server unreachable")]
        assert len(unreachable) == 2 and all("503" in e["error"] for e in unreachable)
        assert logged("API server reachable (GET /version)") and logged("starting operator")
        status, body = await http_get(health, "/readyz")
        assert status == 200 and body["ready"] is True and "waitingFor" not in body
        exited = await op.terminate()
    assert exited.code == 0, exited.stderr
    assert_clean(exited.stderr)
    # The signing key was created in the namespace once the API server answered.
    assert kube.count("POST", "/namespaces/nodewright-system/secrets") == 1


# ----------------------------------------------------------------------------------------------------
# The wait itself, on a fake clock


def _refused() -> aiohttp.ClientConnectorError:
    key: Any = type("Key", (), {"ssl": False, "host": "10.0.0.1", "port": 6443})()
    return aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (_refused(), True),
        (TimeoutError(), True),
        (aiohttp.ServerDisconnectedError(), True),
        (ApiError(503, "ServiceUnavailable", "starting"), True),
        (ApiError(500, "InternalError", "etcd"), True),
        (ApiError(429, "TooManyRequests", "slow down"), True),
        (ApiError(401, "Unauthorized", ""), False),
        (ApiError(403, "Forbidden", ""), False),
        (NotFound(404, "NotFound", ""), False),
        (ValueError("a bug"), False),
    ],
)
def test_is_outage(error: BaseException, outage: bool) -> None:
    assert is_outage(error) is outage


async def test_until_reachable_backs_off_exponentially_and_logs_each_attempt() -> None:
    clock = FakeClock(autojump=True)
    failures = 8
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise _refused()
        return "ok"

    with capture_logs() as logs:
        result = await until_reachable(call, what="GET /version", server="https://api", clock=clock, cap=30.0)
    assert result == "ok" and calls == failures + 1
    delays = clock.slept
    assert len(delays) == failures
    for attempt, delay in enumerate(delays):
        base = min(30.0, 2.0**attempt)
        assert base <= delay <= min(30.0, 2 * base), (attempt, delay)
    assert delays[-1] == 30.0  # capped
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == failures
    assert warnings[0]["event"] == f"API server unreachable (GET /version); next try in {delays[0]:.1f} s"
    assert warnings[0]["server"] == "https://api" and "Connection refused" in warnings[0]["error"]
    assert [w["attempt"] for w in warnings] == list(range(1, failures + 1))
    assert logs[-1]["event"] == "API server reachable (GET /version)" and logs[-1]["attempts"] == failures + 1


async def test_until_reachable_raises_answers_at_once() -> None:
    clock = FakeClock(autojump=True)

    async def call() -> None:
        raise ApiError(401, "Unauthorized", "bad token")

    with pytest.raises(ApiError):
        await until_reachable(call, what="GET /version", server="https://api", clock=clock)
    assert clock.slept == []


async def test_readiness_says_what_the_manager_waits_for() -> None:
    clock = FakeClock()
    client = KubeClient(ClusterConfig(server=NOBODY, ssl_context=None, auth=NoAuth()))
    manager = Manager(client, health_bind_address="0", clock=clock, rng=random.Random(1))
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise _refused()

    async def setup() -> None:
        await manager.until_reachable(call, what="GET /version")

    run = asyncio.create_task(manager.run(handle_signals=False, setup=setup))
    await eventually(lambda: clock.sleepers > 0)
    status = manager.status()
    assert status["ready"] is False
    assert status["waitingFor"].startswith("GET /version: ClientConnectorError")
    clock.advance(60)
    await eventually(lambda: bool(manager.status()["ready"]))
    assert "waitingFor" not in manager.status()
    manager.stop()
    assert await asyncio.wait_for(run, 5) == 0


async def test_setup_failure_propagates_and_closes_the_client() -> None:
    client = KubeClient(ClusterConfig(server=NOBODY, ssl_context=None, auth=NoAuth()))
    manager = Manager(client, health_bind_address="127.0.0.1:0")

    async def setup() -> None:
        client._http()  # a session exists, as after a first request
        raise RuntimeError("namespace gone")

    with pytest.raises(RuntimeError, match="namespace gone"):
        await manager.run(handle_signals=False, setup=setup)
    assert client._session is None
    assert manager.health.port is not None  # it was listening; stopped with the run


async def test_stop_while_waiting_returns_0() -> None:
    clock = FakeClock()
    manager = Manager(
        KubeClient(ClusterConfig(server=NOBODY, ssl_context=None, auth=NoAuth())),
        health_bind_address="0",
        clock=clock,
    )

    async def never() -> None:
        raise _refused()

    async def setup() -> None:
        await manager.until_reachable(never, what="GET /version")

    run = asyncio.create_task(manager.run(handle_signals=False, setup=setup))
    await eventually(lambda: clock.sleepers > 0)
    manager.stop()
    assert await asyncio.wait_for(run, 5) == 0


def test_describe_error_is_one_line() -> None:
    assert describe_error(ValueError("a\nb")) == "ValueError: a b"
