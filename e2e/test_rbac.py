"""The chart's RBAC proven: the operator, the webhook and the uninstall hook run with tokens of the chart's
own ServiceAccounts through a rollout over every path, and not one request is answered 403.

On a control plane of its own (e2e/helm_support.py: audit log, OwnerReferencesPermissionEnforcement),
`helm install` puts the chart in; then, as local processes with exactly the args the chart rendered:

- the webhook (its ServiceAccount): creates its certificate Secret, fills in the caBundle of both
  configurations, serves admission (the configurations are pointed at it by URL: the local control
  plane has no Service routing), and on a restart with another name renews the certificate (Secret
  replaced);
- the operator (its ServiceAccount, leader election on the chart's Lease, forced drains allowed):
  four NodeWrights exercise drain `wait` (PDB refusals, still cordoned), `skip` (released after the
  timeout), `force` (pods deleted), a service and a reboot interrupt, a DeploymentPolicy (its status),
  a package ConfigMap created and then replaced by a config change, the revision history (created,
  renumbered when the first spec comes back, pruned when the limit drops), a shared DisruptionBudget (slots
  and aggregates in its status), a failing first attempt (its log tail read), Events, a forged
  package pod (deleted as untrusted), and the finalizer released on deletion;
- `helm uninstall`: the pre-delete hook runs `nodewright uninstall` with the hook's ServiceAccount; the
  NodeWright still draining and the complete one are released; afterwards no node carries a key of ours,
  the cordon NodeWright made is gone while the admin's stays, the Secrets, the Lease, ConfigMaps,
  revisions and package pods are gone, and the CRDs (crds.keep=false) are deleted without hanging.

The audit log must show requests from all three ServiceAccounts and no 403 for any of them; their logs
must not mention one either.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from e2e.helm_support import (
    CHART,
    NAMESPACE,
    REPO,
    ChartCluster,
    HookRunner,
    chart_cluster,
    exists,
    node_leftovers,
    scratch_root,
    service_account_kubeconfig,
    service_account_user,
    stop_chart_cluster,
    wait_gone,
)
from e2e.operator_fixture import (
    condition_of,
    create_nodewright,
    delete_nodewright,
    nodewright_manifest,
    package,
    status_of,
    wait_statuses,
)
from nodewright.sim import fleet
from nodewright.sim.controlplane import free_port
from nodewright.sim.kubeapi import JSON, KubeClient

pytestmark = pytest.mark.timeout(900)

RELEASE = "nw"
OPERATOR_SA, WEBHOOK_SA, HOOK_SA = "nw-nodewright", "nw-nodewright-webhook", "nw-nodewright-uninstall"
RUNTIME_TAINT = {"key": "nodewright.io/runtime-required", "value": "true", "effect": "NoSchedule"}
NW_API = "/apis/nodewright.io/v1alpha1"


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartCluster]:
    cluster = chart_cluster(scratch_root("nodewright-rbac-"))
    try:
        yield cluster
    finally:
        stop_chart_cluster(cluster)


class LocalProcess:
    """`python -m nodewright <args>`: a chart container run as a local process, logged to a file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {' '.join(self.args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nodewright", *self.args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def check_running(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} exited:\n{self.tail()}"

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


def rendered_args(manifest: str, kind: str, name: str) -> list[str]:
    """The first container's args of object `kind/name` in a rendered release manifest."""
    for doc in yaml.safe_load_all(manifest):
        if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
            args: list[str] = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            return args
    raise AssertionError(f"{kind} {name} not in the release manifest")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def wait_http_ok(url: str, proc: LocalProcess, *, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        proc.check_running()
        if await asyncio.to_thread(_http_ok, url):
            return
        await asyncio.sleep(0.3)
    raise TimeoutError(f"{url} not ready within {within}s:\n{proc.tail()}")


async def wait_port(port: int, proc: LocalProcess, *, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        proc.check_running()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        await asyncio.sleep(0.3)
    raise TimeoutError(f"port {port} not open within {within}s:\n{proc.tail()}")


async def point_webhooks_at(kube: KubeClient, port: int) -> None:
    """What kube-proxy would do for the webhook Service: route the API server's calls to the process.
    The caBundle the webhook wrote stays."""
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        name = "nodewright-validating" if kind.startswith("validating") else "nodewright-mutating"
        path = f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}"
        current = await kube.get(path)
        ops = []
        for i, hook in enumerate(current["webhooks"]):
            config = hook["clientConfig"]
            assert config.get("caBundle"), f"{name}: the webhook did not fill in caBundle"
            url = f"https://127.0.0.1:{port}{config['service']['path']}"
            ops.append(
                {
                    "op": "replace",
                    "path": f"/webhooks/{i}/clientConfig",
                    "value": {"url": url, "caBundle": config["caBundle"]},
                }
            )
        await kube.request("PATCH", path, body=ops, content_type="application/json-patch+json")


async def webhook_serves(kube: KubeClient) -> bool:
    """A server-side dry-run create answered by the mutating webhook (it fills in packages.*.name)."""
    body = nodewright_manifest("probe", fleet_prefix="none", packages={"probe": package()})
    answer = await kube.request("POST", f"{NW_API}/nodewrights", body=body, params={"dryRun": "All"})
    return bool(answer["spec"]["packages"]["probe"].get("name") == "probe")


async def pdb_blocked(kubeconfig: Path, node: str, name: str) -> fleet.TrainingJob:
    return await fleet.create_workloads(kubeconfig, nodes=[node], job=name, min_available=1)


def drain_nodewright(name: str, policy: str) -> JSON:
    pkg = package(interrupt={"type": "service", "services": ["containerd"]})
    return nodewright_manifest(
        name, fleet_prefix=name, packages={"svc": pkg}, drain={"timeout": "3s", "policy": policy}
    )


async def node(kube: KubeClient, name: str) -> JSON:
    return await kube.get(f"/api/v1/nodes/{name}")


@contextlib.asynccontextmanager
async def processes(*procs: LocalProcess) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            proc.stop()
            print(f"\n----- {proc.name} log tail ({proc.log_path}) -----\n{proc.tail(80)}")


async def test_chart_service_accounts_run_every_path_without_a_403(
    chart: ChartCluster, tmp_path: Path
) -> None:
    plane, helm = chart.plane, chart.helm
    # No --wait: the local control plane runs no Deployment controller, so no pod ever becomes ready.
    helm.run(
        "install", RELEASE, str(CHART), "-n", NAMESPACE,
        "--set", "drain.allowForce=true", "--set", "crds.keep=false",
    )  # fmt: skip
    manifest = helm.run("get", "manifest", RELEASE, "-n", NAMESPACE).stdout
    async with KubeClient(plane.kubeconfig) as kube:
        webhook_kubeconfig = await service_account_kubeconfig(
            kube, plane, namespace=NAMESPACE, name=WEBHOOK_SA, path=tmp_path / "webhook.kubeconfig"
        )
        operator_kubeconfig = await service_account_kubeconfig(
            kube, plane, namespace=NAMESPACE, name=OPERATOR_SA, path=tmp_path / "operator.kubeconfig"
        )
        webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
        webhook_args = [
            *rendered_args(manifest, "Deployment", "nw-nodewright-webhook"),
            f"--kubeconfig={webhook_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--port={webhook_port}",
            "--cert-host=127.0.0.1",
        ]
        webhook = LocalProcess("webhook", webhook_args, tmp_path)
        operator = LocalProcess(
            "operator",
            [
                *rendered_args(manifest, "Deployment", "nw-nodewright"),
                f"--kubeconfig={operator_kubeconfig}",
                f"--health-probe-bind-address=127.0.0.1:{health_port}",
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                "--log-level=debug",  # pod-log and event failures are logged at debug/warning only
                "--log-format=json",
            ],
            tmp_path,
        )
        runner = HookRunner(kube, plane, NAMESPACE, tmp_path)
        async with processes(webhook, operator):
            webhook.start()
            await wait_port(webhook_port, webhook)
            await point_webhooks_at(kube, webhook_port)
            await fleet.wait_for(lambda: webhook_serves(kube), within=30, what="webhook serving")
            operator.start()
            await wait_http_ok(f"http://127.0.0.1:{health_port}/readyz", operator)
            await rollout(chart, kube, tmp_path)
            await renew_certificate(kube, webhook, webhook_args, webhook_port, tmp_path)

            async def stop_operator(job: JSON) -> None:
                # The hook scales the operator Deployment to 0; here the process is what would stop.
                operator.stop()

            runner.before_run = stop_operator
            async with runner:
                done = await asyncio.to_thread(
                    helm.run, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m", check=False
                )
            hook_output = "\n".join(f"--- {r.job} ({r.returncode}):\n{r.output}" for r in runner.runs)
            assert done.returncode == 0, f"helm uninstall failed:\n{done.stderr}\n{hook_output}"
            assert [r.job for r in runner.runs] == ["nw-nodewright-uninstall"], hook_output
            assert runner.runs[0].returncode == 0 and runner.runs[0].service_account == HOOK_SA, hook_output
            assert "DisruptionBudget rb-pool: deleted" in runner.runs[0].output, hook_output
            await assert_clean(kube, plane.kubeconfig)
        users = [service_account_user(NAMESPACE, sa) for sa in (OPERATOR_SA, WEBHOOK_SA, HOOK_SA)]
        for user in users:
            assert chart.audit.requests_by(user) > 0, f"no request of {user} in the audit log"
        assert chart.audit.forbidden(users) == []
        # Every 403 of the API server says "forbidden" (Status reason Forbidden), whichever client logs it.
        for text in (operator.text(), webhook.text(), runner.runs[0].output):
            lines = [line for line in text.splitlines() if "forbidden" in line.lower()]
            assert lines == [], lines[:5]


async def rollout(chart: ChartCluster, kube: KubeClient, work: Path) -> None:
    kubeconfig = chart.plane.kubeconfig
    policy = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": "rb-policy"},
        "spec": {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}},
    }
    await kube.create(f"{NW_API}/deploymentpolicies", policy)
    single = {}
    for prefix in ("rb-w", "rb-f", "rb-s"):
        single[prefix] = (await fleet.create_nodes(kubeconfig, count=1, name_prefix=prefix))[0]
    wait_node, force_node, skip_node = single["rb-w"], single["rb-f"], single["rb-s"]
    reboot_nodes = await fleet.create_nodes(kubeconfig, count=2, name_prefix="rb-r")
    (bystander,) = await fleet.create_nodes(kubeconfig, count=1, name_prefix="rb-x")
    # The admin's cordons and a runtime-required taint: the cordons must outlive the uninstall, the taint not.
    for name in (reboot_nodes[0], bystander):
        await kube.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}})
    await kube.merge_patch(f"/api/v1/nodes/{bystander}", {"spec": {"taints": [RUNTIME_TAINT]}})
    for target, job in ((wait_node, "rb-w"), (force_node, "rb-f"), (skip_node, "rb-s")):
        await pdb_blocked(kubeconfig, target, job)

    for name, drain in (("rb-w", "wait"), ("rb-f", "force"), ("rb-s", "skip")):
        await create_nodewright(kube, drain_nodewright(name, drain))
    reboot_pkg = package(
        interrupt={"type": "reboot"},
        configMap={"sysctl.conf": "vm.swappiness=10\n"},
        env={"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1"},
    )
    # A shared DisruptionBudget over the reboot nodes: slots are written into its status (patch, and a
    # fresh get after a lost race) and the budget controller keeps its aggregates. The admin's cordon
    # of rb-r-00000 takes one of its two slots.
    budget = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": "rb-pool"},
        "spec": {"nodeSelector": {"matchLabels": {fleet.FLEET_LABEL: "rb-r"}}, "budget": {"count": 2}},
    }
    await kube.create(f"{NW_API}/disruptionbudgets", budget)
    await create_nodewright(
        kube,
        nodewright_manifest(
            "rb-r", fleet_prefix="rb-r", packages={"tune": reboot_pkg}, deploymentPolicy="rb-policy"
        ),
    )
    # A forged package pod of rb-r: the operator must delete it (untrusted).
    forged = fleet.package_pod_manifest(
        name="rb-forged", node=reboot_nodes[1], nodewright="rb-r", package="tune"
    )
    await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", forged)

    # force: the PDB-held pod is deleted after the timeout; the node completes and is uncordoned.
    done = await wait_statuses(kube, "rb-f", "rb-f", "complete", within=120)
    assert not done[0]["spec"].get("unschedulable")

    # skip: released after the timeout (DrainTimeout), uncordoned.
    async def skipped() -> bool:
        reason = (condition_of(await node(kube, skip_node), "rb-s") or {}).get("reason")
        return reason == "DrainTimeout"

    await fleet.wait_for(skipped, within=90, what="drain skip reported")

    # wait: still cordoned, the condition names the policy.
    async def waiting() -> bool:
        current = await node(kube, wait_node)
        message = (condition_of(current, "rb-w") or {}).get("message", "")
        return "policy wait" in message and bool(current["spec"].get("unschedulable"))

    await fleet.wait_for(waiting, within=90, what="drain wait reported")
    # reboot + policy + ConfigMap + a failed first attempt.
    await wait_statuses(kube, "rb-r", "rb-r", "complete", within=240)
    stored_policy = await kube.get(f"{NW_API}/deploymentpolicies/rb-policy")
    assert stored_policy.get("status"), "the operator wrote no DeploymentPolicy status"
    stored_budget = await kube.get(f"{NW_API}/disruptionbudgets/rb-pool")
    assert (stored_budget.get("status") or {}).get("matched") == 2, stored_budget.get("status")
    assert not await exists(kube, f"/api/v1/namespaces/{NAMESPACE}/pods/rb-forged"), "forged pod not deleted"
    # A config change: the ConfigMap is replaced, the config stage runs.
    changed = await kube.merge_patch(
        f"{NW_API}/nodewrights/rb-r",
        {"spec": {"packages": {"tune": {"configMap": {"sysctl.conf": "vm.swappiness=5\n"}}}}},
    )
    await wait_statuses(
        kube, "rb-r", "rb-r", "complete", within=240, generation=changed["metadata"]["generation"]
    )
    await revisions(kube, changed)
    events = await kube.list_all("/api/v1/namespaces/default/events")
    assert any(e["involvedObject"].get("name") == "rb-r" for e in events["items"]), "no Event about rb-r"
    # Deleting with the operator running: it releases its nodes and the finalizer itself.
    await delete_nodewright(kube, "rb-f", within=90)
    await delete_nodewright(kube, "rb-s", within=90)
    # The operator's own release (docs: state, status label, condition, timing and admission go; an
    # admission written by the very pass that releases the finalizer is removed too).
    leftovers = node_leftovers(await node(kube, force_node))
    assert leftovers == [], leftovers
    assert status_of(await node(kube, wait_node), "rb-w") == "in_progress"  # left for the uninstall


REVISIONS = f"/apis/apps/v1/namespaces/{NAMESPACE}/controllerrevisions"


async def revision_numbers(kube: KubeClient) -> list[tuple[str, int]]:
    listed = await kube.list_all(REVISIONS, params={"labelSelector": "nodewright.io/nodewright=rb-r"})
    return sorted(((o["metadata"]["name"], o["revision"]) for o in listed["items"]), key=lambda r: r[1])


async def revisions(kube: KubeClient, changed: JSON) -> None:
    """The revision history's writes: created (two specs so far), renumbered when the first spec comes
    back (a patch), pruned when the limit drops (a delete)."""
    created = await revision_numbers(kube)
    assert [n for _, n in created] == [1, 2], created
    reverted = await kube.merge_patch(
        f"{NW_API}/nodewrights/rb-r",
        {"spec": {"packages": {"tune": {"configMap": {"sysctl.conf": "vm.swappiness=10\n"}}}}},
    )
    await wait_statuses(
        kube, "rb-r", "rb-r", "complete", within=240, generation=reverted["metadata"]["generation"]
    )
    first = created[0][0]
    assert await revision_numbers(kube) == [created[1], (first, 3)], "renumbered, not copied"
    await kube.merge_patch(f"{NW_API}/nodewrights/rb-r", {"spec": {"revisionHistoryLimit": 0}})

    async def pruned() -> bool:
        return await revision_numbers(kube) == [(first, 3)]

    await fleet.wait_for(pruned, within=60, what="the oldest revision deleted")


async def renew_certificate(
    kube: KubeClient, webhook: LocalProcess, args: list[str], port: int, work: Path
) -> None:
    """A restart with another certificate name: the webhook renews the pair (Secret replaced by name)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/secrets/nodewright-webhook-tls"
    before = (await kube.get(path))["data"]["tls.crt"]
    webhook.stop()
    webhook.args = [*args, "--cert-host=localhost"]
    webhook.start()
    await wait_port(port, webhook)
    after = (await kube.get(path))["data"]["tls.crt"]
    assert after != before, "the serving certificate was not renewed"
    await fleet.wait_for(lambda: webhook_serves(kube), within=30, what="webhook serving the renewed pair")


async def assert_clean(kube: KubeClient, kubeconfig: Path) -> None:
    nodes = (await kube.list_all("/api/v1/nodes"))["items"]
    leftovers = {n["metadata"]["name"]: node_leftovers(n) for n in nodes}
    assert {k: v for k, v in leftovers.items() if v} == {}
    cordoned = sorted(n["metadata"]["name"] for n in nodes if n["spec"].get("unschedulable"))
    # The admin cordoned rb-r-00000 and rb-x-00000; NodeWright's cordon of rb-w-00000 is gone.
    assert cordoned == ["rb-r-00000", "rb-x-00000"], cordoned
    for path in (
        f"/api/v1/namespaces/{NAMESPACE}/secrets/nodewright-operator-signing-key",
        f"/api/v1/namespaces/{NAMESPACE}/secrets/nodewright-webhook-tls",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/nodewright-operator",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/nodewright-validating",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/nodewright-mutating",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/nw-nodewright",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/nw-nodewright-uninstall",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/nw-nodewright-events",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{HOOK_SA}",
        f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/nw-nodewright-uninstall",
    ):
        assert not await exists(kube, path), f"{path} left behind"
    selector = {"labelSelector": "nodewright.io/managed-by=nodewright-operator"}
    for path in (
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        REVISIONS,
    ):
        left = (await kube.list_all(path, params=selector))["items"]
        assert left == [], [o["metadata"]["name"] for o in left]
    # crds.keep=false: helm deleted the CRDs, which completes because no finalizer is left.
    for crd in ("nodewrights.nodewright.io", "deploymentpolicies.nodewright.io"):
        await wait_gone(kube, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}", within=60)
