"""What the operator's reconcilers share (`Runtime`), and the contract between its two controllers.

Two controllers work on one event loop (see `controller.operator`):

- the **rollout** controller, keyed by NodeWright name: compartments, budgets, batches. It decides
  which nodes may start work and records that decision on each node in the *admission* annotation
  `nodewright.io/batch.<nw>` (it is the only writer of that key, `api.admission`), writes the
  NodeWright status, and keeps the runtime-required taints;
- the **node** controller, keyed by `<nw>/<node>` (`node_key`): the stage machine of one NodeWright on
  one node. It is the only writer of the state annotation `nodewright.io/state.<nw>`
  (`api.nodestate`), the status label `nodewright.io/status.<nw>`, the timing annotation
  (`api.timing`), the node condition `nodewright.io/<nw>` (its reason is an
  `api.reasons.NodeConditionReason`) and the cordon; it marks an admission consumed in the write that
  records the node settled under it.

How each signals the other: a status-label change on a node enqueues the rollout controller
(`enqueue_rollout`); an admission written or released enqueues the node key (`enqueue_node`). What
each reads from the other: the rollout controller reads the status label, the state, the condition's
*reason* (never its message: the message is for people) and the drain-skip memory of the timing
annotation (`plan.rollout_input`); the node controller reads the admission.

Because each key has exactly one writer and writes are JSON merge patches of single keys, the two never
overwrite each other. What remains is staleness: right after a write, the informer cache still holds the
old node until the watch event arrives; the `WriteThrough` overlays (`node_view`, `nodewright_view`)
close that gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from nodewright.api.modelcache import ModelCache
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.reasons import PolicyInvalid
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.options import OperatorOptions
from nodewright.controller.signing import PodSigner, UntrustedReason
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import EVENTS, JSON, NotFound
from nodewright.kube.writethrough import WriteThrough
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.recorder import EventRecorder as SeriesRecorder
from nodewright.observability.tracing import RolloutTracer

NODE_KEY_SEPARATOR: Final = "/"


def node_key(nodewright: str, node: str) -> str:
    """Queue key of the node controller. Neither name may contain '/' (DNS subdomain names)."""
    return f"{nodewright}{NODE_KEY_SEPARATOR}{node}"


def split_node_key(key: str) -> tuple[str, str]:
    nodewright, _, node = key.partition(NODE_KEY_SEPARATOR)
    return nodewright, node


class _KubeEvents:
    """`observability.recorder.EventSink` over the operator's client."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def create_event(self, namespace: str, body: JSON) -> JSON:
        return await self._client.create(EVENTS, body, namespace=namespace)

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> bool:
        try:
            await self._client.patch(EVENTS, name, patch, namespace=namespace)
        except NotFound:
            return False
        return True


class EventRecorder(SeriesRecorder):
    """Events as series with counts, never dropped (`nodewright.observability.recorder`), sent through
    `client` (the operator gives Events a client with its own rate limit)."""

    def __init__(self, client: KubeClient, *, clock: Callable[[], datetime], instance: str) -> None:
        super().__init__(_KubeEvents(client), clock=clock, instance=instance)


@dataclass
class Runtime:
    """Everything the reconcilers share; built once by `controller.operator.wire`.

    `enqueue_rollout(nw)` and `enqueue_node(nw, node)` are set at wiring time and add keys to the two
    controllers' queues (deduplicated, safe to call from informer handlers and reconcilers).
    """

    client: KubeClient
    options: OperatorOptions
    nodewrights: Informer
    policies: Informer
    nodes: Informer
    pods: Informer
    models: ModelCache
    node_view: WriteThrough
    nodewright_view: WriteThrough
    signer: PodSigner
    metrics: OperatorMetrics
    tracer: RolloutTracer
    events: EventRecorder
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    enqueue_rollout: Callable[[str], None] = field(default=lambda name: None)
    enqueue_node: Callable[[str, str], None] = field(default=lambda nw, node: None)
    enqueue_node_after: Callable[[str, str, float], None] = field(default=lambda nw, node, s: None)
    enqueue_node_start: Callable[[str, str], None] | None = None
    """Enqueues a freshly admitted node on the node queue's start lane, served after reactions to running
    work (`kube.workqueue`, "Start lane"); None: like `enqueue_node`."""
    pod_expectations: PodExpectations = field(default_factory=PodExpectations)

    def start_node(self, nw: str, node: str) -> None:
        """A node was admitted: its key, on the start lane (`enqueue_node_start`)."""
        (self.enqueue_node_start or self.enqueue_node)(nw, node)

    def __post_init__(self) -> None:
        self.metrics.init_untrusted_pods(reason.value for reason in UntrustedReason)

    def nodewright(self, name: str) -> tuple[JSON | None, NodeWright | None, str | None]:
        """(raw object, parsed model or None, validation error or None) of a cached NodeWright."""
        obj = self.nodewright_view.get(name)
        if obj is None:
            return None, None, None
        model, error = self.models.nodewright(obj)
        return obj, model, error

    def policy(self, name: str) -> DeploymentPolicy | PolicyInvalid | None:
        """The cached DeploymentPolicy `name`; PolicyInvalid when it fails validation; None when absent."""
        obj = self.policies.get(name)
        if obj is None:
            return None
        return self.models.policy_or_problems(obj)

    def node(self, name: str) -> JSON | None:
        """The newest known node object (our own writes included)."""
        return self.node_view.get(name)
