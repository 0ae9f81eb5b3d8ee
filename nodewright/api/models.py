"""Pydantic models of the NodeWright and DeploymentPolicy custom resources (group nodewright.io/v1alpha1).

These models are the single source of truth for the API: the CRD schemas under `manifests/crds/` are
generated from them, the admission webhook validates with them, and the controller reads cached objects
through them. Field names and meanings match the reference system's `Skyhook` and `DeploymentPolicy`
(`skyhook.nvidia.com/v1alpha1`) so that existing manifests convert by changing `apiVersion` and `kind`.

Conventions:
- JSON names are camelCase (`alias_generator`), Python names snake_case; `populate_by_name` lets tests
  build models with Python names.
- Unknown fields are ignored when reading from the cluster (`extra="ignore"`), so an older operator keeps
  working against a newer CRD; the CRD's structural schema prunes unknown fields on write anyway.
- Defaults that the API server can apply are declared here and emitted into the schema.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from nodewright.api import constants


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        extra="ignore",
        frozen=True,
    )

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# ----------------------------------------------------------------------------------------------------
# Shared Kubernetes shapes


class LabelSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(_Model):
    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(_Model):
    """A container environment variable; `valueFrom` is passed through unchanged (secretKeyRef etc.)."""

    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


# ----------------------------------------------------------------------------------------------------
# NodeWright


class InterruptType(StrEnum):
    SERVICE = "service"
    REBOOT = "reboot"
    NOOP = "noop"
    RESTART_ALL_SERVICES = "restartAllServices"


class Interrupt(_Model):
    type: InterruptType
    services: list[str] | None = None


class Resources(_Model):
    cpu_request: str | None = None
    cpu_limit: str | None = None
    memory_request: str | None = None
    memory_limit: str | None = None


class Uninstall(_Model):
    enabled: bool = False
    apply: bool = False


class Package(_Model):
    name: str | None = None
    version: str
    image: str
    container_sha: str | None = Field(default=None, alias="containerSHA")
    agent_image_override: str | None = None
    interrupt: Interrupt | None = None
    depends_on: dict[str, str] | None = None
    config_interrupts: dict[str, Interrupt] | None = None
    config_map: dict[str, str] | None = None
    env: list[EnvVar] | None = None
    resources: Resources | None = None
    graceful_shutdown: str | None = None
    uninstall: Uninstall | None = None


class Budget(_Model):
    percent: Annotated[int, Field(ge=0, le=100)] | None = None
    count: Annotated[int, Field(ge=0)] | None = None


class Sequencing(StrEnum):
    NODE = "node"
    ALL = "all"


class DeploymentPolicyOptions(_Model):
    reset_batch_state_on_completion: bool | None = None


class NodeWrightSpec(_Model):
    node_selectors: LabelSelector | None = None
    packages: dict[str, Package] = Field(default_factory=dict)
    pod_non_interrupt_labels: LabelSelector | None = None
    interruption_budget: Budget | None = None
    deployment_policy: str | None = None
    deployment_policy_options: DeploymentPolicyOptions | None = None
    additional_tolerations: list[Toleration] | None = None
    runtime_required: bool = False
    auto_taint_new_nodes: bool = False
    priority: Annotated[int, Field(ge=1)] = constants.DEFAULT_PRIORITY
    sequencing: Sequencing = Sequencing.NODE
    serial: bool = False


class Status(StrEnum):
    """Roll-up status of a NodeWright, and of a node for one NodeWright."""

    UNKNOWN = "unknown"
    COMPLETE = "complete"
    BLOCKED = "blocked"
    WAITING = "waiting"
    DISABLED = "disabled"
    PAUSED = "paused"
    IN_PROGRESS = "in_progress"
    ERRORING = "erroring"


class Condition(_Model):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class BatchState(_Model):
    current_batch: int = 1
    consecutive_failures: int = 0
    completed_nodes: int = 0
    failed_nodes: int = 0
    should_stop: bool = False
    last_batch_size: int = 0
    last_batch_failed: bool = False


class CompartmentStatus(_Model):
    matched: int = 0
    ceiling: int = 0
    in_progress: int = 0
    completed: int = 0
    progress_percent: int = 0
    batch_state: BatchState | None = None


class NodeWrightStatus(_Model):
    observed_generation: int | None = None
    status: Status | None = None
    conditions: list[Condition] | None = None
    compartment_statuses: dict[str, CompartmentStatus] | None = None
    nodes_in_progress: int = 0
    nodes_erroring: int = 0
    complete_nodes: str = "0/0"
    package_list: str = ""
    node_counts: dict[str, int] | None = None


class ObjectMeta(_Model):
    name: str
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None


class NodeWright(_Model):
    api_version: str = constants.API_VERSION
    kind: Literal["NodeWright"] = "NodeWright"
    metadata: ObjectMeta
    spec: NodeWrightSpec
    status: NodeWrightStatus | None = None


# ----------------------------------------------------------------------------------------------------
# DeploymentPolicy


class FixedStrategy(_Model):
    initial_batch: Annotated[int, Field(ge=1)] = 1
    batch_threshold: Annotated[int, Field(ge=1, le=100)] = 100
    failure_threshold: Annotated[int, Field(ge=1)] | None = None
    safety_limit: Annotated[int, Field(ge=1, le=100)] = 50


class LinearStrategy(FixedStrategy):
    delta: Annotated[int, Field(ge=1)] = 1


class ExponentialStrategy(FixedStrategy):
    growth_factor: Annotated[int, Field(ge=2)] = 2


class Strategy(_Model):
    """Exactly one of fixed, linear, exponential."""

    fixed: FixedStrategy | None = None
    linear: LinearStrategy | None = None
    exponential: ExponentialStrategy | None = None


class PolicyBudget(_Model):
    """Exactly one of percent (1..100) or count (>= 1)."""

    percent: Annotated[int, Field(ge=1, le=100)] | None = None
    count: Annotated[int, Field(ge=1)] | None = None


class PolicyDefault(_Model):
    budget: PolicyBudget
    strategy: Strategy


class Compartment(_Model):
    name: Annotated[str, Field(min_length=1)]
    selector: LabelSelector
    budget: PolicyBudget
    strategy: Strategy | None = None


class DeploymentPolicySpec(_Model):
    default: PolicyDefault
    compartments: list[Compartment] | None = None
    reset_batch_state_on_completion: bool = True


class DeploymentPolicy(_Model):
    api_version: str = constants.API_VERSION
    kind: Literal["DeploymentPolicy"] = "DeploymentPolicy"
    metadata: ObjectMeta
    spec: DeploymentPolicySpec
