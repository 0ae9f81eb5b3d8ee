"""The Helm chart rendered by a real `helm` (hack/helm/build.sh builds it from Go modules when missing):
`helm lint --strict`, and `helm template` over a matrix of values, checked object by object.

No cluster is needed: `helm template` renders against the Kubernetes version helm was built for. The
install, upgrade and uninstall on a real API server are e2e/test_helm.py and e2e/test_rbac.py.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright.cli.flags import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "nodewright"
NAMESPACE = "nodewright-system"
Obj = dict[str, Any]


@cache
def helm() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "helm" / "build.sh")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"hack/helm/build.sh failed:\n{done.stderr[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


def parse_args(args: list[str]) -> Any:
    """`args` parsed by the parser of their command (`nodewright <command> ...`), as the image runs them."""
    parser = OneLineParser(prog="nodewright")
    subparsers = parser.add_subparsers(dest="command")
    importlib.import_module(f"nodewright.cli.{args[0]}_cmd").register(subparsers)
    return parser.parse_args(args)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, check=False, timeout=120)


def render(
    *sets: str, namespace: str = NAMESPACE, values: Obj | None = None, tmp: Path | None = None
) -> list[Obj]:
    args = ["template", "nw", str(CHART), "-n", namespace]
    for item in sets:
        args += ["--set", item]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    done = run_helm(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def refused(*sets: str, namespace: str = NAMESPACE) -> str:
    args = ["template", "nw", str(CHART), "-n", namespace]
    for item in sets:
        args += ["--set", item]
    done = run_helm(*args)
    assert done.returncode != 0, f"rendered although it should not: {sets}"
    return done.stderr


def one(objs: Iterable[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def kinds(objs: Iterable[Obj]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


def container(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    first: Obj = spec["containers"][0]
    return first


def matches(selector: Obj, labels: Obj) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def rules(objs: Iterable[Obj], kind: str, name: str) -> list[Obj]:
    found: list[Obj] = one(objs, kind, name)["rules"]
    return found


def grants(rule_list: list[Obj], resource: str, verb: str, *, name: str | None = None) -> bool:
    for rule in rule_list:
        if resource in rule["resources"] and verb in rule["verbs"]:
            names = rule.get("resourceNames")
            if not names or (name is not None and name in names):
                return True
    return False


def unrestricted(rule_list: list[Obj], resource: str, verb: str) -> bool:
    return any(
        resource in r["resources"] and verb in r["verbs"] and not r.get("resourceNames") for r in rule_list
    )


# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        (),
        (
            "drain.allowForce=true",
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ),
        ("webhook.enabled=false", "uninstall.enabled=false", "crds.install=false", "metrics.enabled=false"),
        (
            "replicaCount=1",
            "leaderElection.enabled=false",
            "rbac.create=false",
            "serviceAccount.create=false",
            "serviceAccount.name=existing",
            "webhook.serviceAccount.create=false",
            "webhook.serviceAccount.name=wh",
        ),
    ],
)
def test_helm_lint_strict(sets: tuple[str, ...]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    done = run_helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_defaults_render_the_expected_objects() -> None:
    objs = render()
    assert kinds(objs) >= {
        ("Deployment", "nw-nodewright"),
        ("Deployment", "nw-nodewright-webhook"),
        ("PodDisruptionBudget", "nw-nodewright"),
        ("Service", "nw-nodewright-metrics"),
        ("Service", "nw-nodewright-webhook"),
        ("ServiceAccount", "nw-nodewright"),
        ("ServiceAccount", "nw-nodewright-webhook"),
        ("ServiceAccount", "nw-nodewright-uninstall"),
        ("ClusterRole", "nw-nodewright"),
        ("ClusterRole", "nw-nodewright-webhook"),
        ("Role", "nw-nodewright-events"),
        ("Job", "nw-nodewright-uninstall"),
        ("CustomResourceDefinition", "nodewrights.nodewright.io"),
        ("CustomResourceDefinition", "deploymentpolicies.nodewright.io"),
        ("CustomResourceDefinition", "disruptionbudgets.nodewright.io"),
        ("ValidatingWebhookConfiguration", "nodewright-validating"),
        ("MutatingWebhookConfiguration", "nodewright-mutating"),
    }
    assert not [o for o in objs if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    operator = one(objs, "Deployment", "nw-nodewright")
    assert container(operator)["image"] == "ghcr.io/nodewright/nodewright:0.1.0"
    assert "--agent-image=ghcr.io/nodewright/agent:0.1.0" in container(operator)["args"]
    assert "--allow-force-drain=false" in container(operator)["args"]


@pytest.mark.parametrize(
    ("kind", "name", "command"),
    [
        ("Deployment", "nw-nodewright", "operator"),
        ("Deployment", "nw-nodewright-webhook", "webhook"),
        ("Job", "nw-nodewright-uninstall", "uninstall"),
    ],
)
def test_every_container_args_parse(kind: str, name: str, command: str) -> None:
    args = container(one(render("drain.allowForce=true"), kind, name))["args"]
    assert args[0] == command
    parsed = parse_args(args)
    assert parsed.namespace == NAMESPACE
    if command == "operator":
        assert parsed.leader_elect is True and parsed.allow_force_drain is True
        assert parsed.lease_name == "nodewright-operator"
    if command == "uninstall":
        assert parsed.operator_deployment == "nw-nodewright" and parsed.lease_name == "nodewright-operator"


def test_operator_behaviour_values_reach_its_flags() -> None:
    defaults = parse_args(container(one(render(), "Deployment", "nw-nodewright"))["args"])
    assert defaults.reapply_on_reboot is False and defaults.keep_succeeded_logs is False
    assert defaults.reboot_timeout == 1200 and defaults.drift_checks == 4
    assert defaults.chain_packages is True and defaults.admissions_per_pass == 32
    assert defaults.admission_writers == 8
    sets = (
        "admissionsPerPass=8",
        "admissionWriters=2",
        "reapplyOnReboot=true",
        "chainPackages=false",
        "rebootTimeout=600",
        "packageLogs.keepSucceeded=true",
        "drift.maxConcurrentChecks=16",
    )
    parsed = parse_args(container(one(render(*sets), "Deployment", "nw-nodewright"))["args"])
    assert parsed.reapply_on_reboot is True and parsed.keep_succeeded_logs is True
    assert parsed.chain_packages is False and parsed.admissions_per_pass == 8
    assert parsed.admission_writers == 2
    assert parsed.reboot_timeout == 600 and parsed.drift_checks == 16


def test_each_component_selects_only_its_own_pods() -> None:
    objs = render()
    pods = {
        name: one(objs, kind, name)["spec"]["template"]["metadata"]["labels"]
        for kind, name in (
            ("Deployment", "nw-nodewright"),
            ("Deployment", "nw-nodewright-webhook"),
            ("Job", "nw-nodewright-uninstall"),
        )
    }
    selectors = {
        "Deployment nw-nodewright": one(objs, "Deployment", "nw-nodewright")["spec"]["selector"][
            "matchLabels"
        ],
        "PDB nw-nodewright": one(objs, "PodDisruptionBudget", "nw-nodewright")["spec"]["selector"][
            "matchLabels"
        ],
        "Service nw-nodewright-metrics": one(objs, "Service", "nw-nodewright-metrics")["spec"]["selector"],
    }
    for what, selector in selectors.items():
        assert [n for n, labels in pods.items() if matches(selector, labels)] == ["nw-nodewright"], what
    webhook_selectors = [
        one(objs, "Deployment", "nw-nodewright-webhook")["spec"]["selector"]["matchLabels"],
        one(objs, "Service", "nw-nodewright-webhook")["spec"]["selector"],
    ]
    for selector in webhook_selectors:
        assert [n for n, labels in pods.items() if matches(selector, labels)] == ["nw-nodewright-webhook"]


def test_operator_rbac_is_least_privilege() -> None:
    objs = render()
    cluster = rules(objs, "ClusterRole", "nw-nodewright")
    namespaced = rules(objs, "Role", "nw-nodewright")
    assert grants(cluster, "deploymentpolicies/status", "patch")
    assert grants(cluster, "nodewrights/finalizers", "update")
    for verb in ("get", "list", "watch"):
        assert grants(cluster, "disruptionbudgets", verb)
    assert grants(cluster, "disruptionbudgets/status", "patch") and not grants(
        cluster, "disruptionbudgets", "patch"
    )
    assert grants(cluster, "pods", "list") and grants(cluster, "pods/eviction", "create")
    assert grants(cluster, "pods", "watch"), "nodeOrder idleFirst counts pods per node (controller.podcosts)"
    assert not grants(cluster, "pods", "delete"), "pod delete needs drain.allowForce=true"
    assert not any("secrets" in r["resources"] or "configmaps" in r["resources"] for r in cluster)
    assert not any(r["apiGroups"] == ["admissionregistration.k8s.io"] for r in cluster)
    assert not unrestricted(namespaced, "secrets", "get")
    assert grants(namespaced, "secrets", "get", name="nodewright-operator-signing-key")
    assert not unrestricted(namespaced, "leases", "update") and not unrestricted(namespaced, "leases", "get")
    assert grants(namespaced, "leases", "update", name="nodewright-operator")
    assert grants(namespaced, "pods/binding", "create"), "package pods are bound (and sealed) by the operator"
    for verb in ("list", "create", "patch", "delete"):
        assert grants(namespaced, "controllerrevisions", verb), "the revision history (docs/rollout.md)"
    assert not grants(cluster, "controllerrevisions", "list"), "revisions live in the release namespace"
    assert not grants(namespaced, "pods", "patch") and not grants(cluster, "pods/binding", "create")
    assert rules(objs, "Role", "nw-nodewright-events") == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
    ]
    assert one(objs, "Role", "nw-nodewright-events")["metadata"]["namespace"] == "default"
    forced = rules(render("drain.allowForce=true"), "ClusterRole", "nw-nodewright")
    assert grants(forced, "pods", "delete")


def test_the_webhook_has_its_own_narrow_service_account() -> None:
    objs = render()
    deployment = one(objs, "Deployment", "nw-nodewright-webhook")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "nw-nodewright-webhook"
    cluster = rules(objs, "ClusterRole", "nw-nodewright-webhook")
    namespaced = rules(objs, "Role", "nw-nodewright-webhook")
    for resource, verb in (
        ("nodes", "patch"),
        ("pods/eviction", "create"),
        ("pods", "delete"),
        ("nodes", "update"),
    ):
        assert not grants(cluster, resource, verb), (resource, verb)
    for kind, name in (
        ("validatingwebhookconfigurations", "nodewright-validating"),
        ("mutatingwebhookconfigurations", "nodewright-mutating"),
    ):
        assert grants(cluster, kind, "patch", name=name) and not unrestricted(cluster, kind, "patch")
    assert grants(namespaced, "secrets", "update", name="nodewright-webhook-tls")
    assert not unrestricted(namespaced, "secrets", "get") and not unrestricted(
        namespaced, "secrets", "update"
    )


def test_the_uninstall_hook_and_its_rbac_exist_only_while_it_runs() -> None:
    objs = render()
    hooks = [o for o in objs if o["metadata"]["name"] == "nw-nodewright-uninstall"]
    assert {o["kind"] for o in hooks} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job",
    }  # fmt: skip
    for obj in hooks:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert weights["Job"] > max(w for k, w in weights.items() if k != "Job")
    namespaced = rules(objs, "Role", "nw-nodewright-uninstall")
    assert grants(namespaced, "deployments/scale", "patch", name="nw-nodewright")
    assert grants(namespaced, "controllerrevisions", "delete")
    assert not unrestricted(namespaced, "secrets", "delete") and not unrestricted(
        namespaced, "leases", "delete"
    )
    assert render("uninstall.enabled=false") and not [
        o for o in render("uninstall.enabled=false") if o["metadata"]["name"] == "nw-nodewright-uninstall"
    ]


def test_crds_are_templates_that_helm_upgrades_and_keeps() -> None:
    objs = render()
    for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        generated = yaml.safe_load(path.read_text())
        rendered = one(objs, "CustomResourceDefinition", generated["metadata"]["name"])
        assert rendered["spec"] == generated["spec"], path.name
        assert rendered["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    dropped = render("crds.keep=false")
    for crd in (o for o in dropped if o["kind"] == "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    assert not [o for o in render("crds.install=false") if o["kind"] == "CustomResourceDefinition"]
    assert not (CHART / "crds").exists(), "Helm never upgrades crds/: the chart renders files/crds/"


def test_monitoring_objects() -> None:
    objs = render("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom")  # fmt: skip
    monitor = one(objs, "ServiceMonitor", "nw-nodewright")
    service = one(objs, "Service", "nw-nodewright-metrics")
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    rule = one(objs, "PrometheusRule", "nw-nodewright")
    shipped = yaml.safe_load((ROOT / "manifests" / "monitoring" / "prometheus-rules.yaml").read_text())
    assert rule["spec"] == shipped["spec"]
    assert "{{ $labels.nodewright }}" in json.dumps(rule["spec"])  # Prometheus' templates, not Helm's
    copy = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert copy == shipped, "helm/nodewright/files/prometheus-rules.yaml must equal manifests/monitoring/'s"


def test_metrics_disabled_removes_the_service_and_port() -> None:
    objs = render("metrics.enabled=false")
    assert ("Service", "nw-nodewright-metrics") not in kinds(objs)
    operator = container(one(objs, "Deployment", "nw-nodewright"))
    assert "--metrics-bind-address=0" in operator["args"]
    assert [p["name"] for p in operator["ports"]] == ["probes"]
    assert "serviceMonitor" in refused("metrics.enabled=false", "metrics.serviceMonitor.enabled=true")


def test_pod_values_reach_the_pods(tmp_path: Path) -> None:
    values = {
        "extraEnv": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel:4318"}],
        "podAnnotations": {"a": "1"},
        "podLabels": {"team": "infra"},
        "priorityClassName": "system-cluster-critical",
        "securityContext": {"readOnlyRootFilesystem": True, "runAsNonRoot": True},
        "imagePullSecrets": [{"name": "regcred"}],
        "image": {"digest": "sha256:" + "a" * 64},
        "webhook": {
            "nodeSelector": {"role": "infra"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {}},
            "priorityClassName": "high",
            "extraEnv": [{"name": "X", "value": "z"}],
            "image": {"repository": "example.com/webhook", "tag": "1.2.3"},
        },
    }
    objs = render(values=values, tmp=tmp_path)
    operator = one(objs, "Deployment", "nw-nodewright")["spec"]["template"]
    assert operator["metadata"]["annotations"] == {"a": "1"}
    assert operator["metadata"]["labels"]["team"] == "infra"
    assert operator["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    assert operator["spec"]["priorityClassName"] == "system-cluster-critical"
    assert operator["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    env = {e["name"]: e for e in operator["spec"]["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel:4318" and "POD_NAME" in env
    # Helm merges maps given by the user with the chart's defaults.
    context = operator["spec"]["containers"][0]["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
    assert (
        operator["spec"]["containers"][0]["image"] == "ghcr.io/nodewright/nodewright:0.1.0@sha256:" + "a" * 64
    )
    webhook = one(objs, "Deployment", "nw-nodewright-webhook")["spec"]["template"]["spec"]
    assert webhook["nodeSelector"] == {"role": "infra"}
    assert webhook["tolerations"] == values["webhook"]["tolerations"]  # type: ignore[index]
    assert webhook["affinity"] == {"podAntiAffinity": {}} and webhook["priorityClassName"] == "high"
    assert webhook["imagePullSecrets"] == [{"name": "regcred"}]
    assert webhook["containers"][0]["image"] == "example.com/webhook:1.2.3@sha256:" + "a" * 64
    assert webhook["containers"][0]["env"] == [{"name": "X", "value": "z"}]
    hook = one(objs, "Job", "nw-nodewright-uninstall")["spec"]["template"]["spec"]
    assert hook["imagePullSecrets"] == [{"name": "regcred"}]


def test_leader_election_cannot_be_off_with_replicas() -> None:
    assert "leader election on" in refused("leaderElection.enabled=false")
    single = render("leaderElection.enabled=false", "replicaCount=1")
    assert ("PodDisruptionBudget", "nw-nodewright") not in kinds(single)
    assert "--leader-elect=false" in container(one(single, "Deployment", "nw-nodewright"))["args"]


def test_service_accounts_and_rbac_can_be_brought_by_the_user() -> None:
    assert "serviceAccount.name is required" in refused("serviceAccount.create=false")
    objs = render("serviceAccount.create=false", "serviceAccount.name=mine", "rbac.create=false")
    assert (
        one(objs, "Deployment", "nw-nodewright")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    )
    assert ("ServiceAccount", "nw-nodewright") not in kinds(objs)
    assert not [
        o for o in objs if o["kind"] in ("ClusterRole", "Role") and "uninstall" not in o["metadata"]["name"]
    ]


def test_webhook_disabled_renders_no_webhook_objects() -> None:
    objs = render("webhook.enabled=false")
    assert not [o for o in objs if "webhook" in o["metadata"]["name"]]
    assert not [o for o in objs if o["kind"].endswith("WebhookConfiguration")]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("metrics.serviceMonitor=true",), "serviceMonitor"),  # the old boolean form
        (("nosuchkey=1",), "nosuchkey"),
        (("image.tag=bad tag",), "image"),
        (("image.digest=sha256:xyz",), "digest"),
        (("uninstall.waitForPackageUninstall=5 minutes",), "waitForPackageUninstall"),
        (("drain.allowForce=yes",), "allowForce"),
        (("drift.maxConcurrentChecks=0",), "maxConcurrentChecks"),
        (("rebootTimeout=0",), "rebootTimeout"),
        (("admissionsPerPass=0",), "admissionsPerPass"),
    ],
)
def test_the_schema_refuses_bad_values(sets: tuple[str, ...], message: str) -> None:
    assert message in refused(*sets)


def test_the_default_namespace_is_refused() -> None:
    assert "not default" in refused(namespace="default")


def test_notification_secrets_are_granted_by_name_and_the_cluster_sink_reaches_the_args() -> None:
    plain = rules(render(), "Role", "nw-nodewright")
    assert not grants(plain, "secrets", "get", name="team-webhooks")
    objs = render(
        "notifications.secretNames={team-webhooks,ops-webhook}",
        "notifications.clusterSink.urlSecret=ops-webhook/url",
        "notifications.clusterSink.format=slack",
    )
    namespaced = rules(objs, "Role", "nw-nodewright")
    assert not unrestricted(namespaced, "secrets", "get")
    for name in ("team-webhooks", "ops-webhook"):
        assert grants(namespaced, "secrets", "get", name=name)
    args = parse_args(container(one(objs, "Deployment", "nw-nodewright"))["args"])
    assert (args.notify_url_secret, args.notify_format, args.notify_events) == (
        "ops-webhook/url",
        "slack",
        None,
    )
    assert "/notifications/clusterSink/urlSecret" in refused("notifications.clusterSink.urlSecret=no-key")


def test_health_gate_secrets_are_granted_by_name() -> None:
    plain = rules(render(), "Role", "nw-nodewright")
    assert not grants(plain, "secrets", "get", name="prometheus-url")
    objs = render("healthGates.secretNames={prometheus-url,team-prom}")
    namespaced = rules(objs, "Role", "nw-nodewright")
    assert not unrestricted(namespaced, "secrets", "get")
    assert grants(namespaced, "secrets", "get", name="prometheus-url")
    # The webhook is told the same list, so it refuses a gate naming a Secret the operator cannot read.
    webhook = parse_args(container(one(objs, "Deployment", "nw-nodewright-webhook"))["args"])
    assert webhook.gate_secret_names == frozenset({"prometheus-url", "team-prom"})
    unlisted = parse_args(container(one(render(), "Deployment", "nw-nodewright-webhook"))["args"])
    assert unlisted.gate_secret_names == frozenset()


READS = {"get", "list", "watch"}


def test_people_get_a_viewer_and_an_editor_aggregated_into_view_and_edit_and_nothing_wider(
    tmp_path: Path,
) -> None:
    objs = render()
    viewer = one(objs, "ClusterRole", "nw-nodewright-viewer")
    editor = one(objs, "ClusterRole", "nw-nodewright-editor")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    # Aggregated into roles the whole cluster uses: our kinds only, reads only in view.
    for rule in viewer["rules"] + editor["rules"]:
        assert rule["apiGroups"] == ["nodewright.io"], rule
    assert all(set(rule["verbs"]) <= READS for rule in viewer["rules"])
    assert grants(editor["rules"], "nodewrights", "patch") and not grants(
        editor["rules"], "nodewrights/status", "patch"
    )
    # The plugin's viewer reads, never writes, and reads logs, ConfigMaps and Deployments in the release
    # namespace only.
    plugin = one(objs, "ClusterRole", "nw-nodewright-plugin-viewer")
    assert "aggregate-to-view" not in str(plugin["metadata"]["labels"])
    local = one(objs, "Role", "nw-nodewright-plugin-viewer")
    events = one(objs, "Role", "nw-nodewright-plugin-viewer-events")
    assert local["metadata"]["namespace"] == NAMESPACE and events["metadata"]["namespace"] == "default"
    for rule in plugin["rules"] + local["rules"] + events["rules"]:
        assert set(rule["verbs"]) <= READS, rule
    assert grants(plugin["rules"], "nodes", "list") and not grants(plugin["rules"], "configmaps", "get")
    assert grants(local["rules"], "pods/log", "get") and grants(local["rules"], "deployments", "list")
    assert grants(local["rules"], "controllerrevisions", "list"), "history and undo read the revisions"
    # Bound only to the subjects the values name.
    assert not [o for o in objs if o["kind"].endswith("Binding") and "plugin-viewer" in o["metadata"]["name"]]
    subjects = [{"kind": "Group", "name": "sre-oncall", "apiGroup": "rbac.authorization.k8s.io"}]
    bound = render(values={"rbac": {"userRoles": {"pluginViewers": subjects}}}, tmp=tmp_path)
    for kind, name in (
        ("ClusterRoleBinding", "nw-nodewright-plugin-viewer"),
        ("RoleBinding", "nw-nodewright-plugin-viewer"),
        ("RoleBinding", "nw-nodewright-plugin-viewer-events"),
    ):
        assert one(bound, kind, name)["subjects"] == subjects
    assert "nw-nodewright-viewer" not in str(render("rbac.userRoles.create=false"))
    assert "pluginViewers" in refused(
        "rbac.userRoles.pluginViewers[0].kind=Robot", "rbac.userRoles.pluginViewers[0].name=x"
    )
