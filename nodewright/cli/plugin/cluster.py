"""Reading the cluster for the plugin: NodeWrights, policies, budgets, nodes, package pods, Events, PDBs.

Everything is a GET or LIST through `nodewright.kube.client` (no watch, no cache). Nodes are listed
before NodeWrights for the reason `nodewright plan` gives: the operator writes a NodeWright's batch
state before the admissions it opens on nodes, so this order never pairs admissions with an older batch
state. Workload pods are listed per node (field selector `spec.nodeName`), only for the nodes a verb
explains in detail, and PodDisruptionBudgets only in the namespaces of those pods -- never a
cluster-wide pod list.

Objects are parsed with the operator's own `ModelCache`, so an object the operator refuses is refused
here for the same reason (and reported, never a traceback).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nodewright.api import constants
from nodewright.cli.plugin.common import NotFoundError

if TYPE_CHECKING:
    from nodewright.api.models import DeploymentPolicy, NodeWright
    from nodewright.api.reasons import PolicyInvalid
    from nodewright.kube.client import KubeClient
    from nodewright.plan.drain import PodFacts

JSON = dict[str, Any]


@dataclass
class ClusterState:
    """One consistent-enough read of what the plugin explains."""

    nodes: list[JSON]
    nodewright_objects: list[JSON]
    nodewrights: dict[str, NodeWright]
    invalid: dict[str, str]
    policies: dict[str, DeploymentPolicy]
    policy_objects: dict[str, JSON]
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    budget_objects: list[JSON] = field(default_factory=list)
    """DisruptionBudgets (none when their CRD is not installed)."""
    invalid_policies: dict[str, PolicyInvalid] = field(default_factory=dict)
    """Policies the operator refuses, with what is wrong with each (it starts nothing for their users)."""
    pod_facts: dict[str, list[PodFacts]] | None = None
    """What the drain's rule reads of each node's pods (`pod_facts`), read only when a policy orders
    `idleFirst`; None: not read (no disruption costs)."""

    def policy(self, name: str) -> DeploymentPolicy | PolicyInvalid | None:
        """The policy `name` as the operator sees it: its model, what is wrong with it, or None (absent)."""
        return self.policies.get(name) or self.invalid_policies.get(name)

    def nodewright(self, name: str) -> NodeWright:
        model = self.nodewrights.get(name)
        if model is not None:
            return model
        if name in self.invalid:
            raise NotFoundError(
                f"NodeWright {name!r} is invalid and the operator leaves it alone: {self.invalid[name]}"
            )
        raise NotFoundError(f"NodeWright {name!r} not found (kubectl get nodewrights lists them)")

    def node(self, name: str) -> JSON:
        for node in self.nodes:
            if node["metadata"]["name"] == name:
                return node
        raise NotFoundError(f"node {name!r} not found")

    def raw(self, name: str) -> JSON:
        for obj in self.nodewright_objects:
            if obj["metadata"]["name"] == name:
                return obj
        raise NotFoundError(f"NodeWright {name!r} not found")


async def read_state(client: KubeClient, *, label_selector: str | None = None) -> ClusterState:
    from nodewright.api.modelcache import ModelCache
    from nodewright.kube.resources import DEPLOYMENTPOLICIES, DISRUPTIONBUDGETS, NODES, NODEWRIGHTS, NotFound

    nodes = (await client.list(NODES, label_selector=label_selector)).items
    nw_objects = (await client.list(NODEWRIGHTS)).items
    policy_objects = (await client.list(DEPLOYMENTPOLICIES)).items
    try:
        budget_objects = (await client.list(DISRUPTIONBUDGETS)).items
    except NotFound:
        budget_objects = []  # an operator older than shared budgets: nothing to account for
    cache = ModelCache()
    models: dict[str, NodeWright] = {}
    invalid: dict[str, str] = {}
    for obj in nw_objects:
        model, error = cache.nodewright(obj)
        name = str(obj["metadata"]["name"])
        if model is not None:
            models[name] = model
        else:
            invalid[name] = error or "invalid"
    from nodewright.api.models import DeploymentPolicy

    policies: dict[str, DeploymentPolicy] = {}
    invalid_policies: dict[str, PolicyInvalid] = {}
    for obj in policy_objects:
        policy = cache.policy_or_problems(obj)
        if isinstance(policy, DeploymentPolicy):
            policies[policy.metadata.name] = policy
        else:
            invalid_policies[policy.policy_name] = policy
    from nodewright.plan import disruption

    opted_in = any(disruption.opted_in(p) for p in policies.values())
    return ClusterState(
        pod_facts=await pod_facts(client) if opted_in else None,
        nodes=nodes,
        nodewright_objects=nw_objects,
        nodewrights=models,
        invalid=invalid,
        policies=policies,
        policy_objects={str(o["metadata"]["name"]): o for o in policy_objects},
        budget_objects=budget_objects,
        invalid_policies=invalid_policies,
    )


TARGET_NODE_ANNOTATION = f"{constants.PREFIX}target-node"


def pod_node(pod: JSON) -> str:
    """The node a package pod runs on, or will run on once the operator binds it."""
    bound = (pod.get("spec") or {}).get("nodeName")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(bound or annotations.get(TARGET_NODE_ANNOTATION) or "")


async def package_pods(
    client: KubeClient, namespace: str, *, nodewright: str, node: str | None = None
) -> list[JSON]:
    """The NodeWright's package pods in the operator namespace (optionally for one node: selected by
    the pods' node label, then checked against the node they are bound or targeted to)."""
    from nodewright.kube.resources import PODS
    from nodewright.plan.podspec import label_value

    selector = f"{constants.POD_LABEL_NODEWRIGHT}={nodewright}"
    if node:
        selector += f",{constants.POD_LABEL_NODE}={label_value(node)}"
    pods = (await client.list(PODS, namespace=namespace, label_selector=selector)).items
    return [p for p in pods if node is None or pod_node(p) == node]


async def node_pods(client: KubeClient, node: str) -> list[JSON]:
    """Every pod bound to `node` (workloads included), for the drain explanation."""
    from nodewright.kube.resources import PODS

    return (await client.list(PODS, field_selector=f"spec.nodeName={node}")).items


async def pod_facts(client: KubeClient) -> dict[str, list[PodFacts]]:
    """The drain facts of every bound, unfinished pod, by node (`plan.drain.facts_of`): the disruption
    costs of `nodeOrder: idleFirst`, as the operator's count-only cache keeps them
    (`controller.podcosts`). One paginated LIST of the whole cluster's pods: read only when needed."""
    from nodewright.controller.podcosts import FIELD_SELECTOR
    from nodewright.kube.resources import PODS
    from nodewright.plan.drain import facts_of

    by_node: dict[str, list[PodFacts]] = {}
    for pod in (await client.list(PODS, field_selector=FIELD_SELECTOR)).items:
        facts = facts_of(pod)
        if facts.counts:
            by_node.setdefault(str((pod.get("spec") or {}).get("nodeName") or ""), []).append(facts)
    return by_node


async def disruption_budgets(client: KubeClient, namespaces: Iterable[str]) -> list[JSON]:
    from nodewright.kube.resources import PODDISRUPTIONBUDGETS

    out: list[JSON] = []
    for namespace in sorted(set(namespaces)):
        out.extend((await client.list(PODDISRUPTIONBUDGETS, namespace=namespace)).items)
    return out


async def recent_events(client: KubeClient, *, kind: str, name: str, limit: int = 50) -> list[JSON]:
    """The newest Events NodeWright recorded about one object (default namespace, where Events about
    cluster-scoped objects live), oldest first. Selected by the API server (field selectors), so a
    cluster with thousands of Events costs one small answer."""
    from nodewright.kube.resources import EVENTS

    selector = f"involvedObject.kind={kind},involvedObject.name={name},source={COMPONENT}"
    page = await client.list_page(EVENTS, namespace="default", field_selector=selector, limit=None)
    items = list(page.get("items") or [])
    items.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return items[-limit:]


COMPONENT = "nodewright-operator"
