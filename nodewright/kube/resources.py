"""Resource addressing and API errors.

A `Resource` is the minimum needed to build a REST path: API group and version, plural, and whether
the resource is namespaced. Core resources (group "") live under `/api/v1`, everything else under
`/apis/<group>/<version>`. Objects are plain dicts (what the API server sends), never generated models:
decoding Kubernetes JSON into classes costs CPU and memory that an operator watching thousands of nodes
cannot afford (see the kubernetes_asyncio notes in the reference).

API errors carry the HTTP status and the `Status` object's `reason` and `message`. The subclasses are
the outcomes callers branch on: `NotFound` (404), `Conflict` (409: resourceVersion precondition failed,
or `AlreadyExists` on create), `Gone` (410: the resourceVersion is older than the server's history),
`TooManyRequests` (429: API Priority and Fairness, or an Eviction blocked by a PodDisruptionBudget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from nodewright.api import constants

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool
    kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        if self.namespaced and namespace is None:
            return f"{base}/{self.plural}"  # all namespaces (list/watch only)
        return f"{base}/{self.plural}"

    def item_path(self, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self.plural} is namespaced: a namespace is required")
        path = f"{self.collection_path(namespace)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    @property
    def label(self) -> str:
        """The resource label used in metrics and logs."""
        return self.plural if not self.group else f"{self.plural}.{self.group}"


NODES: Final = Resource("", "v1", "nodes", False, "Node")
PODS: Final = Resource("", "v1", "pods", True, "Pod")
EVENTS: Final = Resource("", "v1", "events", True, "Event")
SECRETS: Final = Resource("", "v1", "secrets", True, "Secret")
NAMESPACES: Final = Resource("", "v1", "namespaces", False, "Namespace")
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
PODDISRUPTIONBUDGETS: Final = Resource("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
NODEWRIGHTS: Final = Resource(
    constants.GROUP, constants.VERSION, constants.PLURAL_NODEWRIGHT, False, constants.KIND_NODEWRIGHT
)
DEPLOYMENTPOLICIES: Final = Resource(
    constants.GROUP, constants.VERSION, constants.PLURAL_POLICY, False, constants.KIND_POLICY
)
DISRUPTIONBUDGETS: Final = Resource(
    constants.GROUP, constants.VERSION, constants.PLURAL_BUDGET, False, constants.KIND_BUDGET
)
CONTROLLERREVISIONS: Final = Resource("apps", "v1", "controllerrevisions", True, "ControllerRevision")
_ADMISSION = "admissionregistration.k8s.io"
VALIDATINGWEBHOOKCONFIGURATIONS: Final = Resource(
    _ADMISSION, "v1", "validatingwebhookconfigurations", False, "ValidatingWebhookConfiguration"
)
MUTATINGWEBHOOKCONFIGURATIONS: Final = Resource(
    _ADMISSION, "v1", "mutatingwebhookconfigurations", False, "MutatingWebhookConfiguration"
)
CUSTOMRESOURCEDEFINITIONS: Final = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition"
)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, body: JSON | str | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def retry_after(self) -> float | None:
        details = self.body.get("details") if isinstance(self.body, dict) else None
        seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
        return float(seconds) if isinstance(seconds, int | float) else None


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    pass


class TooManyRequests(ApiError):
    pass


_BY_STATUS: Final[dict[int, type[ApiError]]] = {404: NotFound, 409: Conflict, 410: Gone, 429: TooManyRequests}


def api_error(status: int, body: JSON | str | None) -> ApiError:
    """Build the right error from an HTTP status and a (possibly non-JSON) body."""
    reason, message = "", ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    elif body:
        message = body[:2000]
    cls = _BY_STATUS.get(status, ApiError)
    return cls(status, reason or _default_reason(status), message, body)


def _default_reason(status: int) -> str:
    return {404: "NotFound", 409: "Conflict", 410: "Gone", 429: "TooManyRequests"}.get(
        status, "InternalError" if status >= 500 else "Unknown"
    )


def object_key(obj: JSON) -> str:
    """The store key of an object: `namespace/name`, or `name` for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name
