"""The Helm chart on a real local control plane: a real `helm`, ServiceAccount tokens, the hook Job run.

Used by e2e/test_helm.py and e2e/test_rbac.py.

- `helm_binary()`: the helm built from Go modules by hack/helm/build.sh (built on first use, cached).
- `chart_cluster()`: a control plane of the test module's own. The chart installs cluster-wide objects
  (CRDs it owns, webhook configurations named like the project's, ClusterRoles) and `helm uninstall`
  deletes CRDs, which would pull the ground from under every other e2e test in the session cluster. Its
  kube-apiserver also writes an audit log (`Audit`), so a 403 answered to one of the chart's
  ServiceAccounts is found even when the client only logs it at debug level, and it enables the
  OwnerReferencesPermissionEnforcement admission plugin, which real clusters (OpenShift) run: owner
  references with blockOwnerDeletion then need `update` on the owner's finalizers.
- `service_account_kubeconfig()`: a kubeconfig with a bound token of a ServiceAccount (TokenRequest, as
  the kubelet's projected token would be): processes started with it have exactly the chart's RBAC.
- `HookRunner`: the local control plane has no Job controller and no kubelet for real pods, so `helm
  uninstall` would wait for its pre-delete Job forever. The runner plays both: it takes the Job's
  container args and ServiceAccount as the chart rendered them, runs `nodewright <args>` locally with
  that ServiceAccount's token (the one thing the kubelet would add: `--kubeconfig` instead of the token
  mount), and writes the Job's status Complete or Failed, which is what `helm` watches for.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodewright.sim.binaries import locate
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "nodewright"
NAMESPACE = "nodewright-system"
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def helm_binary() -> Path:
    """hack/helm/build.sh: a no-op printing the cached binary's path, or a build (3-6 min) when missing."""
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "helm" / "build.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"hack/helm/build.sh failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Helm:
    binary: Path
    kubeconfig: Path
    home: Path  # HELM_CACHE_HOME etc.: nothing from the machine's own helm configuration

    def run(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=self.env(),
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}"
            )
        return done

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            HELM_CACHE_HOME=str(self.home / "cache"),
            HELM_CONFIG_HOME=str(self.home / "config"),
            HELM_DATA_HOME=str(self.home / "data"),
        )
        return env

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), *args]


@dataclass
class Audit:
    """kube-apiserver's audit log (Metadata level, ServiceAccount requests only)."""

    path: Path

    def events(self) -> Iterator[JSON]:
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)

    def forbidden(self, users: Sequence[str]) -> list[str]:
        """Every request of `users` answered 403, as `user verb uri`."""
        found = []
        for event in self.events():
            user = (event.get("user") or {}).get("username", "")
            if user in users and (event.get("responseStatus") or {}).get("code") == 403:
                found.append(f"{user} {event.get('verb')} {event.get('requestURI')}")
        return found

    def requests_by(self, user: str) -> int:
        return sum(1 for e in self.events() if (e.get("user") or {}).get("username") == user)


@dataclass
class ChartCluster:
    plane: ControlPlane
    audit: Audit
    helm: Helm
    root: Path

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig


def chart_cluster(root: Path, *, controllers: Sequence[str] = ()) -> ChartCluster:
    """Create and start a control plane of its own (module docstring); `stop_chart_cluster` ends it.

    `controllers` are kube-controller-manager controllers to run besides the simulator's (e.g.
    `clusterrole-aggregation-controller`, which fills the built-in `view` and `edit` roles)."""
    plane = ControlPlane.create(root / "cp", bins=locate())
    if controllers:
        manager = plane.components["kube-controller-manager"].argv
        index = next(i for i, arg in enumerate(manager) if arg.startswith("--controllers="))
        manager[index] += "," + ",".join(controllers)
    policy = root / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit = root / "audit.log"
    plane.components["kube-apiserver"].argv += [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit}",
        "--audit-log-mode=blocking",
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
    ]
    plane.save()
    plane.up()
    home = root / "helm-home"
    home.mkdir(exist_ok=True)
    return ChartCluster(plane, Audit(audit), Helm(helm_binary(), plane.kubeconfig, home), root)


def stop_chart_cluster(cluster: ChartCluster) -> None:
    cluster.plane.down()
    shutil.rmtree(cluster.root, ignore_errors=True)


def scratch_root(prefix: str) -> Path:
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


async def service_account_kubeconfig(
    kube: KubeClient, plane: ControlPlane, *, namespace: str, name: str, path: Path
) -> Path:
    """A kubeconfig whose user is a bound token of ServiceAccount `namespace/name` (TokenRequest API)."""
    answer = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        },
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sim",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.pki.ca_crt)},
            }
        ],
        "users": [{"name": name, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": "sim", "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    await asyncio.to_thread(_write_private, path, yaml.safe_dump(config))
    return path


def _write_private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


# ----------------------------------------------------------------------------------------------------
# The pre-delete hook Job


@dataclass
class HookRun:
    job: str
    service_account: str
    args: list[str]
    returncode: int
    output: str


@dataclass
class HookRunner:
    """Runs the hook Jobs `helm` creates in `namespace` (see the module docstring)."""

    kube: KubeClient
    plane: ControlPlane
    namespace: str
    work: Path
    before_run: Any = None  # async callable(job) awaited before the Job's command runs
    runs: list[HookRun] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HookRunner:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _loop(self) -> None:
        done: set[str] = set()
        while True:
            listed = await self.kube.list_all(f"/apis/batch/v1/namespaces/{self.namespace}/jobs")
            for job in listed["items"]:
                meta = job["metadata"]
                if meta["uid"] in done or "helm.sh/hook" not in (meta.get("annotations") or {}):
                    continue
                done.add(meta["uid"])
                await self._run(job)
            await asyncio.sleep(0.5)

    async def _run(self, job: JSON) -> None:
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        account = pod.get("serviceAccountName") or "default"
        container = pod["containers"][0]
        assert not container.get("command"), "the image's entrypoint (`nodewright`) runs the hook"
        args = list(container.get("args") or [])
        if self.before_run is not None:
            await self.before_run(job)
        kubeconfig = await service_account_kubeconfig(
            self.kube,
            self.plane,
            namespace=self.namespace,
            name=account,
            path=self.work / f"{name}.kubeconfig",
        )
        started = dt.datetime.now(dt.UTC)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nodewright",
            *args,
            f"--kubeconfig={kubeconfig}",
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        deadline = float(job["spec"].get("activeDeadlineSeconds") or 300)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=deadline)
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
        code = proc.returncode if proc.returncode is not None else -1
        self.runs.append(HookRun(name, account, args, code, out.decode(errors="replace")))
        await self._finish(name, succeeded=code == 0, started=started)

    async def _finish(self, name: str, *, succeeded: bool, started: dt.datetime) -> None:
        """The status the Job controller writes for a finished Job (what `helm` waits for)."""
        now = dt.datetime.now(dt.UTC)

        def stamp(moment: dt.datetime) -> str:
            return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

        if succeeded:
            kinds = ["SuccessCriteriaMet", "Complete"]
            status: JSON = {"succeeded": 1, "completionTime": stamp(max(now, started))}
        else:
            kinds = ["FailureTarget", "Failed"]
            status = {"failed": 1}
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": "CompletionsReached" if succeeded else "BackoffLimitExceeded",
                "message": "run by the e2e hook runner",
                "lastProbeTime": stamp(now),
                "lastTransitionTime": stamp(now),
            }
            for kind in kinds
        ]
        status.update(startTime=stamp(started), conditions=conditions, ready=0, active=0)
        status.setdefault("uncountedTerminatedPods", {})
        path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}/status"
        await self.kube.merge_patch(path, {"status": status})


# ----------------------------------------------------------------------------------------------------
# What a clean cluster looks like


OWNED_ANNOTATION_PREFIXES = ("nodewright.io/state.", "nodewright.io/timing.", "nodewright.io/batch.")
OWNED_ANNOTATIONS = ("nodewright.io/auto-tainted", "nodewright.io/cordoned-by")


def node_leftovers(node: JSON, *, taint_key: str = "nodewright.io/runtime-required") -> list[str]:
    """NodeWright's keys still on a node (the admin's `nodewright.io/ignore` label is not ours)."""
    meta = node["metadata"]
    found = [f"label {k}" for k in meta.get("labels") or {} if k.startswith("nodewright.io/status.")]
    found += [
        f"annotation {k}"
        for k in meta.get("annotations") or {}
        if k.startswith(OWNED_ANNOTATION_PREFIXES) or k in OWNED_ANNOTATIONS
    ]
    found += [
        f"condition {c['type']}"
        for c in (node.get("status") or {}).get("conditions") or []
        if str(c.get("type", "")).startswith("nodewright.io/")
    ]
    found += [f"taint {t['key']}" for t in node["spec"].get("taints") or [] if t.get("key") == taint_key]
    return found


async def exists(kube: KubeClient, path: str) -> bool:
    try:
        await kube.get(path)
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True


async def wait_gone(kube: KubeClient, path: str, *, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while await exists(kube, path):
        assert time.monotonic() < deadline, f"{path} still exists after {within}s"
        await asyncio.sleep(0.5)
