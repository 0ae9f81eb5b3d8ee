"""Wiring of the operator: caches, the three controllers, and the events that feed their queues.

Caches (one watch each, trimmed before caching):
- NodeWrights and DeploymentPolicies (cluster-wide, small);
- Nodes, trimmed to what the controllers read (labels, our annotations, taints, Ready, bootID);
- package pods in the operator namespace only (label `nodewright.io/managed-by`), indexed by node.
Workload pods are never cached: the node controller lists a node's pods on demand while it drains it.

Controllers (queues with client-go semantics; see `kube.workqueue`):
- `rollout` keyed by NodeWright name — `controller.rollout`;
- `node` keyed by `<nodewright>/<node>` — `controller.nodes`;
- `policy` keyed by DeploymentPolicy name — writes the policy's status (printer columns);
- `budget` keyed by DisruptionBudget name — sweeps ownerless slots, keeps its aggregates
  (`controller.budgets`; the slots themselves are written by the rollout passes).

Event mapping is deliberately narrow, because at 10,000 nodes every spurious key is a reconcile:
- a NodeWright change enqueues its rollout key; its node keys only when the generation or the
  annotations (pause, disable, reset) changed, not on our own status writes;
- a Node change enqueues the node key of every NodeWright that selects the node (or still has state on
  it), and the rollout key only when something the rollout reads changed (labels, schedulability,
  readiness, taints, our annotations);
- a package pod change enqueues the node key named by its labels (trust is checked in the reconcile);
- a DeploymentPolicy change enqueues the rollout key of every NodeWright that uses it;
- a DisruptionBudget change enqueues its `budget` key and the rollout keys of the NodeWrights waiting for
  one of its slots; node changes and NodeWright additions and deletions enqueue every budget (coalesced).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from nodewright.api import constants
from nodewright.api.admission import admission_annotation
from nodewright.api.modelcache import ModelCache
from nodewright.api.models import policy_status
from nodewright.api.nodeobject import node_ready
from nodewright.controller.budgets import NODE_EVENT_DELAY, SharedBudgets
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.manager import Manager
from nodewright.controller.nodes import NodeReconciler
from nodewright.controller.notify import Notifier, RolloutNotifications, Sink
from nodewright.controller.options import OperatorOptions
from nodewright.controller.podcosts import PodCosts
from nodewright.controller.rollout import RolloutReconciler
from nodewright.controller.runtime import EventRecorder, Runtime, node_key, split_node_key
from nodewright.controller.signing import SIGNING_SECRET_NAME, PodSigner
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import only_version_changed
from nodewright.kube.resources import (
    DEPLOYMENTPOLICIES,
    DISRUPTIONBUDGETS,
    JSON,
    NODES,
    NODEWRIGHTS,
    PODS,
    SECRETS,
    Conflict,
    NotFound,
)
from nodewright.kube.trim import trim_node
from nodewright.kube.workqueue import Result
from nodewright.kube.writethrough import WriteThrough
from nodewright.observability import events
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.tracing import RolloutTracer
from nodewright.plan import podspec
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.rollout_input import blocked, matches_nodewright, node_context

log = structlog.get_logger("nodewright.operator")

NODE_START_SHARE = 4
"""At most 1/4 of the node workers (16 of 64) start pods for freshly admitted nodes at once: with the
rest free and starts queued behind every reaction, a finished pod is handed over at once even while a
333-node batch is being started (docs/benchmarks.md)."""
ROLLOUT_DEBOUNCE = 1.0
"""Seconds by which node events at least delay the rollout pass they trigger (`Operator._rollout_soon`).
At 1,000 nodes a 0.25 s floor opened batches sooner, but its extra passes cost 28% more operator CPU
(taken from the API server and kwok on the same two cores) and the rollout was not faster (371 s
against 334 s with 1 s)."""
ROLLOUT_LOOP_SHARE = 0.25
"""At most this share of the event loop goes to node-triggered rollout passes of one NodeWright."""
ROLLOUT_DEBOUNCE_MAX = 10.0


async def load_signing_key(client: KubeClient, namespace: str) -> bytes:
    """The HMAC key that marks package pods as ours: read from, or created in, a Secret."""
    import base64

    try:
        secret = await client.get(SECRETS, SIGNING_SECRET_NAME, namespace=namespace)
    except NotFound:
        key = PodSigner.generate_key()
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SIGNING_SECRET_NAME, "namespace": namespace},
            "type": "Opaque",
            "data": {"key": base64.b64encode(key).decode()},
        }
        try:
            await client.create(SECRETS, body, namespace=namespace)
            return key
        except Conflict:
            secret = await client.get(SECRETS, SIGNING_SECRET_NAME, namespace=namespace)
    return base64.b64decode(secret["data"]["key"])


def _meta(obj: JSON) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def rollout_debounce(pass_compute_seconds: float) -> float:
    """How long node events wait for the rollout pass they trigger, given the last pass's compute time:
    long enough that passes take at most `ROLLOUT_LOOP_SHARE` of the loop, within the bounds."""
    delay = pass_compute_seconds * (1 / ROLLOUT_LOOP_SHARE - 1)
    return min(ROLLOUT_DEBOUNCE_MAX, max(ROLLOUT_DEBOUNCE, delay))


def _rollout_relevant(old: JSON, new: JSON, nodewrights: Iterable[str]) -> bool:
    """Did a node change in a way the rollout controller reads?"""
    if (old.get("spec") or {}) != (new.get("spec") or {}):
        return True
    if node_ready(old) != node_ready(new):
        return True
    if _meta(old).get("labels") != _meta(new).get("labels"):
        return True
    old_ann, new_ann = _meta(old).get("annotations") or {}, _meta(new).get("annotations") or {}
    return any(
        old_ann.get(constants.state_annotation(nw)) != new_ann.get(constants.state_annotation(nw))
        # An admission removed by someone else (`kubectl nodewright node retry`) makes the node a
        # candidate again; the rollout's own writes add or consume admissions and need no pass.
        or (admission_annotation(nw) in old_ann and admission_annotation(nw) not in new_ann)
        for nw in nodewrights
    )


class Operator:
    """Builds the Runtime and registers informers and controllers on a Manager."""

    def __init__(
        self,
        manager: Manager,
        *,
        options: OperatorOptions,
        metrics: OperatorMetrics,
        tracer: RolloutTracer,
        signer: PodSigner,
        workers: int = 4,
        node_workers: int = 64,
        instance: str = "nodewright-operator",
        event_client: KubeClient | None = None,
        cluster_sink: Sink | None = None,
    ) -> None:
        client = manager.client
        self.manager = manager
        self.rt = self._runtime(manager, options, metrics, tracer, signer, event_client or client, instance)
        self.budgets = SharedBudgets(self.rt, manager.informer(DISRUPTIONBUDGETS))
        # Per-sink queues and workers: one hanging webhook costs only its own notices (controller.notify).
        self.notifier = Notifier(client, options.namespace, metrics=metrics, warn=self._notification_warning)
        # Pods counted per node only once a policy orders `idleFirst` (controller.podcosts).
        self.pod_costs = PodCosts(
            client, clock=manager.clock, metrics=manager.watch_metrics, spawn=manager.spawn
        )
        self.rollouts = RolloutReconciler(
            self.rt,
            budgets=self.budgets,
            notifications=RolloutNotifications(self.notifier, cluster_sink),
            pod_costs=self.pod_costs,
        )
        self.rollout = manager.controller("rollout", self.rollouts.reconcile, workers=workers)
        # Node reconciles spend their time awaiting API calls (~3 per stage hand-off), so concurrency,
        # not CPU, bounds their throughput: at 5,000 nodes 16 workers left 200+ keys queued while the
        # API server answered in ~0.2 s. Coroutines are cheap; the write rate limit still applies.
        # Pod starts are paced: a freshly admitted node's key waits on the start lane while reactions to
        # running pods are queued, and starts take at most a quarter of the workers, so a burst of
        # admissions (concurrent writes, `--admission-writers`) never delays a finished pod's hand-over.
        self.node = manager.controller(
            "node",
            NodeReconciler(self.rt).reconcile,
            workers=node_workers,
            start_limit=max(1, node_workers // NODE_START_SHARE),
        )
        self.policy = manager.controller("policy", self._reconcile_policy, workers=1)
        self.budget = manager.controller("budget", self.budgets.reconcile, workers=1)
        for controller in (self.rollout, self.node, self.policy, self.budget):
            metrics.init_controller(controller.name)
        self.rt.enqueue_rollout = self._rollout_soon
        self.rt.enqueue_node = lambda nw, node: self.node.queue.add(node_key(nw, node))
        self.rt.enqueue_node_after = lambda nw, node, s: self.node.queue.add_after(node_key(nw, node), s)
        self.rt.enqueue_node_start = lambda nw, node: self.node.queue.add_start(node_key(nw, node))
        self._wire_events()

    def _runtime(
        self,
        manager: Manager,
        options: OperatorOptions,
        metrics: OperatorMetrics,
        tracer: RolloutTracer,
        signer: PodSigner,
        event_client: KubeClient,
        instance: str,
    ) -> Runtime:
        """The informers (trimmed caches) and the shared runtime of the reconcilers."""
        nodewrights = manager.informer(NODEWRIGHTS)
        nodes = manager.informer(NODES, transform=trim_node)
        pods = manager.informer(
            PODS,
            namespace=options.namespace,
            label_selector=f"{constants.POD_OWNER_LABEL}={constants.POD_OWNER_VALUE}",
            transform=signer.trim,  # the signer's digests: a spec is canonicalised once, not per event
        )
        # By the node the pod is for: stage pods are created unbound and bound by the operator later.
        pods.add_index("node", lambda pod: [podspec.pod_node(pod)])
        return Runtime(
            client=manager.client,
            options=options,
            nodewrights=nodewrights,
            policies=manager.informer(DEPLOYMENTPOLICIES),
            nodes=nodes,
            pods=pods,
            models=ModelCache(),
            node_view=WriteThrough(nodes, trim_node),
            nodewright_view=WriteThrough(nodewrights),
            signer=signer,
            metrics=metrics,
            tracer=tracer,
            events=EventRecorder(event_client, clock=lambda: self.rt.clock(), instance=instance),
            pod_expectations=PodExpectations(signer.trim),
        )

    # -- event mapping -----------------------------------------------------------------------------

    def _names(self) -> list[str]:
        return [str(_meta(o).get("name")) for o in self.rt.nodewrights.objects()]

    def _node_keys(self, node: JSON) -> list[str]:
        """Node keys of every NodeWright that selects `node` or still has our keys on it."""
        keys = []
        name = str(_meta(node).get("name"))
        labels = _meta(node).get("labels") or {}
        annotations = _meta(node).get("annotations") or {}
        for obj in self.rt.nodewrights.objects():
            nw_name = str(_meta(obj).get("name"))
            model, _ = self.rt.models.nodewright(obj)
            selected = model is not None and matches_nodewright(model, node)
            ours = (
                constants.status_label(nw_name) in labels
                or constants.state_annotation(nw_name) in annotations
            )
            if selected or ours:
                keys.append(node_key(nw_name, name))
        return keys

    def _wire_events(self) -> None:
        rt = self.rt
        self.rollout.watch(rt.nodewrights)

        def nodewright_changed(old: JSON, new: JSON) -> None:
            old_meta, new_meta = _meta(old), _meta(new)
            if (
                old_meta.get("generation") == new_meta.get("generation")
                and old_meta.get("annotations") == new_meta.get("annotations")
                and old_meta.get("deletionTimestamp") == new_meta.get("deletionTimestamp")
            ):
                return
            self._enqueue_all_nodes(new)

        rt.nodewrights.add_handler(on_add=self._enqueue_all_nodes, on_update=nodewright_changed)
        self._wire_budgets()

        def policy_keys(policy: JSON) -> list[str]:
            name = _meta(policy).get("name")
            return [
                str(_meta(o).get("name"))
                for o in rt.nodewrights.objects()
                if (o.get("spec") or {}).get("deploymentPolicy") == name
            ]

        self.rollout.watch(rt.policies, policy_keys)
        self.policy.watch(rt.policies)

        rt.nodes.add_handler(
            on_add=self._node_added, on_update=self._node_updated, on_delete=self._node_added
        )

        def pod_keys(pod: JSON) -> list[str]:
            labels = _meta(pod).get("labels") or {}
            nw = labels.get(constants.POD_LABEL_NODEWRIGHT)
            node = podspec.pod_node(pod)
            return [node_key(str(nw), node)] if nw and node else []

        expectations = rt.pod_expectations
        rt.pods.add_handler(
            on_add=expectations.observed,
            on_update=lambda old, new: expectations.observed(new),
            on_delete=expectations.observed_delete,
        )
        self.node.watch(rt.pods, pod_keys)

    def _node_added(self, node: JSON) -> None:
        """A node appeared or went: its node keys, and a (debounced) pass of every rollout."""
        for key in self._node_keys(node):
            self.node.queue.add(key)
        for key in self._names():
            self._rollout_soon(key)

    def _node_updated(self, old: JSON, new: JSON) -> None:
        """Its node keys; the rollouts it matters to, at once when it settles the last node of a batch.

        Nothing for an update that changed only the cached node's resourceVersion (a kubelet
        heartbeat, a condition or field we do not cache): no reconcile would see a difference.
        """
        if only_version_changed(old, new):
            return
        keys = set(self._node_keys(old)) | set(self._node_keys(new))
        for key in keys:
            self.node.queue.add(key)
        if not _rollout_relevant(old, new, self._names()):
            return
        node_name = str(_meta(new).get("name"))
        labels = _meta(new).get("labels") or {}
        for nw in {split_node_key(k)[0] for k in keys}:
            if self.rollouts.settles_batch(nw, node_name, labels):
                self.rollout.queue.add(nw)  # the next batch waits for exactly this event
            else:
                self._rollout_soon(nw)

    def _wire_budgets(self) -> None:
        budgets = self.budgets.informer
        self.budget.watch(budgets)

        def waiting_rollouts(obj: JSON) -> None:
            for name in SharedBudgets.waiting_nodewrights(obj):
                self.rollout.queue.add(name)  # a slot may be free for it now: no debounce

        budgets.add_handler(on_update=lambda old, new: waiting_rollouts(new), on_delete=waiting_rollouts)

        def every_budget(_obj: JSON, _new: JSON | None = None) -> None:
            if _new is not None and only_version_changed(_obj, _new):
                return
            for obj in budgets.objects():
                self.budget.queue.add_after(str(_meta(obj).get("name")), NODE_EVENT_DELAY)

        self.rt.nodes.add_handler(on_add=every_budget, on_update=every_budget, on_delete=every_budget)
        self.rt.nodewrights.add_handler(on_add=every_budget, on_delete=every_budget)

    def _rollout_soon(self, name: str) -> None:
        """Node-driven rollout passes are coalesced: at most one pass per NodeWright per debounce.

        A rollout pass reads every matched node, so running one per node event would cost
        O(events x nodes); delaying it lets a burst of node completions share one pass (the queue
        keeps the earliest pending time), at the price of that delay before the next batch opens. The
        delay is `ROLLOUT_DEBOUNCE`, or longer when the last pass computed for long: with a pass
        costing c seconds of loop time, waiting c/share - c keeps rollout passes at
        `ROLLOUT_LOOP_SHARE` of the loop, so the node controller keeps its share however large the
        fleet. Changes to the NodeWright itself are not delayed.
        """
        self.rollout.queue.add_after(name, rollout_debounce(self.rollouts.compute_seconds(name)))

    def _enqueue_all_nodes(self, nodewright: JSON) -> None:
        """A NodeWright appeared or changed: reconcile every node that has something to do for it.

        That is every node carrying its state, status label or admission, and every selected node
        that would get a status of its own (blocked by a taint or the ignore label; all of them
        while paused or disabled). A selected node that would only be `waiting` is left out: its
        reconcile writes nothing, and on a large fleet thousands of such keys would sit in the queue
        in front of the first batch; the rollout controller enqueues it when it admits it.
        """
        name = str(_meta(nodewright).get("name"))
        model, _ = self.rt.models.nodewright(nodewright)
        keys = (constants.state_annotation(name), admission_annotation(name))
        label = constants.status_label(name)
        quiet = model is not None and not is_paused(model) and not is_disabled(model)
        ctx = (
            node_context(
                model, now=self.rt.clock(), runtime_taint_key=self.rt.options.runtime_required_taint_key
            )
            if model is not None
            else None
        )
        for node in self.rt.nodes.objects():
            meta = _meta(node)
            annotations = meta.get("annotations") or {}
            ours = label in (meta.get("labels") or {}) or any(k in annotations for k in keys)
            if not ours:
                if model is None or not matches_nodewright(model, node):
                    continue
                if quiet and ctx is not None and blocked(ctx, node) is None:
                    continue
            self.node.queue.add(node_key(name, str(meta.get("name"))))

    # -- DeploymentPolicy status -------------------------------------------------------------------

    async def _notification_warning(self, nodewright: str, spec: events.EventSpec) -> None:
        """A Warning Event from the notifier (dropped notices) on the NodeWright they are about."""
        obj = self.rt.nodewrights.get(nodewright) or {}
        await self.rt.events.record(
            kind=constants.KIND_NODEWRIGHT,
            name=nodewright,
            uid=(obj.get("metadata") or {}).get("uid"),
            reason=spec.reason.value,
            message=spec.message,
            event_type=spec.type.value,
        )

    async def _reconcile_policy(self, name: str) -> Result | None:
        obj = self.rt.policies.get(name)
        if obj is None:
            self.rt.models.forget(constants.KIND_POLICY, name)
            return None
        model, _ = self.rt.models.policy(obj)
        if model is None:
            return None
        desired = policy_status(model).to_json_dict()
        current: Any = obj.get("status") or {}
        if all(current.get(k) == v for k, v in desired.items()):
            return None
        await self.rt.client.patch_status(DEPLOYMENTPOLICIES, name, {"status": desired})
        return None
