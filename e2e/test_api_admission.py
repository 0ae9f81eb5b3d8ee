"""The API on a real control plane: CRDs installed from manifests/crds, the admission webhook running
in-process on 127.0.0.1 with a generated CA and registered through URL-based webhook configurations.

Checks the acceptance criteria of the API issue: every invalid manifest of tests/data/invalid is
rejected by schema, CEL or webhook with a message naming the offending field; every sample (and every
reference-system manifest after changing apiVersion/kind) is accepted; a DeploymentPolicy in use cannot
be deleted; `kubectl get nw/dp` show the printer columns; `kubectl explain` prints descriptions.

The webhook runs in its own thread and event loop because kubectl calls here are blocking subprocesses:
on the test's loop the server could not answer the API server while kubectl waits for it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from nodewright.api.models import DeploymentPolicy, policy_status
from nodewright.webhook import certs, configs
from nodewright.webhook.server import server_ssl_context, start_webhook_server
from tests.api_corpus import ROOT, convert_reference, invalid_cases, normalize_path, sample_documents

SUFFIX = "-e2e-api"


class _WebhookThread:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.port = 0
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.bundle = certs.new_bundle(
            dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=dt.datetime.now(dt.UTC)
        )
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(30):
            raise TimeoutError("webhook did not start")
        if self.error:
            raise self.error

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        from kubernetes_asyncio import client, config

        from nodewright.webhook.facts import KubeFacts

        self._stop = asyncio.Event()
        await config.load_kube_config(config_file=self.kubeconfig)
        async with client.ApiClient() as api:
            ctx = server_ssl_context(self.bundle.cert, self.bundle.key)
            runner, self.port = await start_webhook_server(
                KubeFacts(api), ssl_context=ctx, host="127.0.0.1", port=0
            )
            self.ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


def _apply(cluster: Any, doc: dict[str, Any], *, dry_run: bool) -> Any:
    args = ["apply", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return cluster.kubectl(*args, input=json.dumps(doc), check=False)


@pytest.fixture(scope="module")
def api(cluster: Any) -> Iterator[Any]:
    crd_dir = ROOT / "manifests" / "crds"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/nodewrights.nodewright.io",
        "crd/deploymentpolicies.nodewright.io",
    )
    hook = _WebhookThread(str(cluster.kubeconfig))
    hook.start()
    docs = configs.url_configurations(f"https://127.0.0.1:{hook.port}", hook.bundle.ca_bundle, suffix=SUFFIX)
    cluster.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in docs))
    # Webhook configurations take effect asynchronously; wait until a webhook-only rule is enforced.
    probe = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "probe-webhook"},
        "spec": {"packages": {"aa": {"version": "1.0", "image": "x", "dependsOn": {"zz": "1.0"}}}},
    }
    deadline = time.monotonic() + 60
    while _apply(cluster, probe, dry_run=True).returncode == 0:
        assert time.monotonic() < deadline, "webhook never took effect"
        time.sleep(0.5)
    try:
        yield cluster
    finally:
        for d in docs:
            cluster.kubectl(
                "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found", check=False
            )
        hook.stop()


@pytest.fixture(scope="module")
def policies(api: Any) -> Iterator[list[str]]:
    """The sample policies, created for real so that NodeWrights referencing them validate."""
    created = []
    for _name, doc in [*sample_documents(reference=False), *sample_documents(reference=True)]:
        doc = convert_reference(doc)
        if doc["kind"] == "DeploymentPolicy":
            result = _apply(api, doc, dry_run=False)
            assert result.returncode == 0, result.stderr
            created.append(doc["metadata"]["name"])
    yield created
    for name in created:
        api.kubectl("delete", "deploymentpolicy", name, "--ignore-not-found", check=False)


@pytest.mark.parametrize(("name", "expect", "doc"), invalid_cases(), ids=[c[0] for c in invalid_cases()])
def test_invalid_manifest_rejected(
    api: Any, policies: list[str], name: str, expect: str, doc: dict[str, Any]
) -> None:
    result = _apply(api, doc, dry_run=True)
    assert result.returncode != 0, f"{name} was accepted:\n{result.stdout}"
    assert normalize_path(expect) in normalize_path(result.stderr), (
        f"{name}: {expect} not named in:\n{result.stderr}"
    )


def _all_samples() -> list[tuple[str, dict[str, Any]]]:
    return [
        *sample_documents(reference=False),
        *[(n, convert_reference(d)) for n, d in sample_documents(reference=True)],
    ]


@pytest.mark.parametrize(("name", "doc"), _all_samples(), ids=[n for n, _ in _all_samples()])
def test_sample_accepted(api: Any, policies: list[str], name: str, doc: dict[str, Any]) -> None:
    result = _apply(api, doc, dry_run=True)
    assert result.returncode == 0, f"{name}: {result.stderr}"


def test_policy_in_use_cannot_be_deleted_and_columns_show(api: Any) -> None:
    policy = yaml.safe_load((ROOT / "manifests" / "samples" / "deploymentpolicy-zones.yaml").read_text())
    policy["metadata"]["name"] = "e2e-api-in-use"
    nw = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "e2e-api-user"},
        "spec": {
            "deploymentPolicy": "e2e-api-in-use",
            "nodeSelectors": {"matchLabels": {"e2e": "api"}},
            "packages": {"pk": {"version": "1.0.0", "image": "registry.local:5000/pk"}},
        },
    }
    try:
        assert _apply(api, policy, dry_run=False).returncode == 0
        created = _apply(api, nw, dry_run=False)
        assert created.returncode == 0, created.stderr
        stored = json.loads(api.kubectl("get", "nw", "e2e-api-user", "-o", "json").stdout)
        assert stored["spec"]["packages"]["pk"]["name"] == "pk"  # mutating webhook
        assert stored["spec"]["packages"]["pk"]["maxAttempts"] == 3  # CRD default

        refused = api.kubectl("delete", "dp", "e2e-api-in-use", check=False)
        assert refused.returncode != 0
        assert "e2e-api-user" in refused.stderr

        header = api.kubectl("get", "nw", "e2e-api-user").stdout.splitlines()[0].split()
        assert header == ["NAME", "STATUS", "READY", "IN-PROGRESS", "ERRORING", "PACKAGES", "POLICY", "AGE"]
        # Write the status the operator writes for a policy, then read it through the printer columns.
        stored_policy = json.loads(api.kubectl("get", "dp", "e2e-api-in-use", "-o", "json").stdout)
        status = policy_status(DeploymentPolicy.model_validate(stored_policy)).to_json_dict()
        api.kubectl(
            "patch",
            "dp",
            "e2e-api-in-use",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )
        row = api.kubectl("get", "dp", "e2e-api-in-use").stdout.splitlines()
        assert row[0].split() == ["NAME", "COMPARTMENTS", "DEFAULT", "STRATEGY", "AGE"]
        assert row[1].split()[:3] == ["e2e-api-in-use", "3", "fixed"]
    finally:
        api.kubectl("delete", "nw", "e2e-api-user", "--ignore-not-found", "--wait=false", check=False)
        api.kubectl(
            "patch",
            "nw",
            "e2e-api-user",
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            check=False,
        )
        deadline = time.monotonic() + 30
        while (
            api.kubectl("get", "nw", "e2e-api-user", check=False).returncode == 0
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        deleted = api.kubectl("delete", "dp", "e2e-api-in-use", "--ignore-not-found", check=False)
        assert deleted.returncode == 0, deleted.stderr


def test_explain_prints_descriptions(api: Any) -> None:
    deadline = time.monotonic() + 60
    while True:
        result = api.kubectl("explain", "nodewright.spec.packages.interrupt", check=False)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)  # the OpenAPI document is republished a few seconds after the CRD is established
    assert result.returncode == 0, result.stderr
    assert "systemd units to restart" in result.stdout
    assert "reboot" in result.stdout
    policy = api.kubectl("explain", "deploymentpolicy.spec.compartments", check=False)
    assert "selector" in policy.stdout
