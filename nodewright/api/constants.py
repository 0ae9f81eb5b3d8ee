"""Names NodeWright writes on the cluster: API group, label, annotation, condition and taint keys.

Every key the operator puts on a Node or a pod is derived here, so the whole contract with the cluster
(what `kubectl get -l`, dashboards and other tools can rely on) is visible in one place.

Kubernetes limits that shape these names: a label or annotation key is an optional DNS-subdomain prefix
(<= 253 characters) plus a name of at most 63 characters (`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`).
Keys built from a NodeWright name (`status.<name>`, `state.<name>`) therefore bound the length of
NodeWright names; see `MAX_NODEWRIGHT_NAME_LENGTH`.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "nodewright.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
PREFIX: Final = f"{GROUP}/"

KIND_NODEWRIGHT: Final = "NodeWright"
PLURAL_NODEWRIGHT: Final = "nodewrights"
SHORT_NODEWRIGHT: Final = "nw"
KIND_POLICY: Final = "DeploymentPolicy"
PLURAL_POLICY: Final = "deploymentpolicies"
SHORT_POLICY: Final = "dp"

KIND_BUDGET: Final = "DisruptionBudget"
PLURAL_BUDGET: Final = "disruptionbudgets"
SHORT_BUDGET: Final = "ndb"

# The reference system's group; manifests written for it convert by changing apiVersion and kind.
REFERENCE_GROUP: Final = "skyhook.nvidia.com"

# Annotations on a NodeWright object (metadata, so toggling them does not bump the generation).
ANNOTATION_PAUSE: Final = f"{PREFIX}pause"
ANNOTATION_DISABLE: Final = f"{PREFIX}disable"
ANNOTATION_RESET_BATCH: Final = f"{PREFIX}reset-batch-state"
FINALIZER: Final = f"{GROUP}/finalizer"

# Node labels and annotations. `<name>` is the NodeWright name.
LABEL_IGNORE: Final = f"{PREFIX}ignore"
STATUS_LABEL_PREFIX: Final = f"{PREFIX}status."
STATE_ANNOTATION_PREFIX: Final = f"{PREFIX}state."
CORDON_ANNOTATION: Final = f"{PREFIX}cordoned-by"
AUTO_TAINT_ANNOTATION: Final = f"{PREFIX}auto-tainted"
NODE_CONDITION_PREFIX: Final = f"{PREFIX}"

DEFAULT_RUNTIME_REQUIRED_TAINT_KEY: Final = f"{PREFIX}runtime-required"

# Labels on package pods (the operator trusts only pods it created: see POD_OWNER_LABEL).
POD_LABEL_NODEWRIGHT: Final = f"{PREFIX}nodewright"
POD_LABEL_PACKAGE: Final = f"{PREFIX}package"
POD_LABEL_VERSION: Final = f"{PREFIX}version"
POD_LABEL_STAGE: Final = f"{PREFIX}stage"
POD_LABEL_NODE: Final = f"{PREFIX}node"
POD_LABEL_PURPOSE: Final = f"{PREFIX}purpose"
"""On drift-check pods (value `drift-check`): read-only checks of a complete node, outside the stage
machine (no package/version label: one pod checks every package of the NodeWright on the node)."""
POD_PURPOSE_DRIFT_CHECK: Final = "drift-check"
POD_STAGE_DRIFT_CHECK: Final = "drift-check"  # the stage label of drift-check pods (simulator, monitor)
POD_OWNER_LABEL: Final = f"{PREFIX}managed-by"
POD_OWNER_VALUE: Final = "nodewright-operator"

DEFAULT_AGENT_IMAGE: Final = "ghcr.io/nodewright/agent:0.1.0"
"""NodeWright's own in-package agent (nodewright/agent, images/agent/Dockerfile); the reference agent
(`nvcr.io/nvidia/skyhook/agent:v6.4.1`) is contract-compatible and can be set with `--agent-image`."""
DEFAULT_COMPARTMENT: Final = "__default__"
DEFAULT_PRIORITY: Final = 200

# Label names (the part after the prefix) are limited to 63 characters; "status." is the longest fixed part.
LABEL_NAME_LIMIT: Final = 63
MAX_NODEWRIGHT_NAME_LENGTH: Final = LABEL_NAME_LIMIT - len("status.")
MAX_PACKAGE_NAME_LENGTH: Final = 43


def status_label(nodewright: str) -> str:
    return f"{STATUS_LABEL_PREFIX}{nodewright}"


def state_annotation(nodewright: str) -> str:
    return f"{STATE_ANNOTATION_PREFIX}{nodewright}"


def node_condition_type(nodewright: str) -> str:
    return f"{NODE_CONDITION_PREFIX}{nodewright}"


# Annotations on package pods. The attempt number lets retries be told apart (and lets the simulator
# fail "the first N attempts"); the interrupt annotation carries the merged interrupt as JSON.
POD_ANNOTATION_ATTEMPT: Final = f"{PREFIX}attempt"
POD_ANNOTATION_INTERRUPT: Final = f"{PREFIX}interrupt"
POD_ANNOTATION_SPEC_HASH: Final = f"{PREFIX}spec-hash"
POD_ANNOTATION_DRIFT_SLOT: Final = f"{PREFIX}drift-slot"  # drift-check pods: the check slot they belong to
POD_ANNOTATION_DRIFT_BASIS: Final = f"{PREFIX}drift-basis"  # drift-check pods: what they check against
POD_ANNOTATION_CHAIN: Final = f"{PREFIX}chain"
"""Packages whose runs follow the pod's own package in the same pod (`--chain-packages`), as JSON
`[[package, version, first stage], ...]` in the order their init containers run."""
POD_ANNOTATION_NODE: Final = f"{PREFIX}target-node"
"""The node a package pod is for. Stage pods are created unbound and bound there by the operator."""
POD_SCHEDULER_NAME: Final = "nodewright-operator"
"""The schedulerName of package pods: no scheduler serves it, so only the operator's binding places them."""

# Environment variables passed to every package pod (reference names and our equivalents).
ENV_NODE_ORDER: Final = ("SKYHOOK_NODE_ORDER", "NODEWRIGHT_NODE_ORDER")
