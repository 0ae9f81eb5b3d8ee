"""Cluster lookups of the admission webhook, over the Kubernetes API (kubernetes_asyncio).

Every request carries `_request_timeout` well below the webhook's `timeoutSeconds` (10 s), so a slow API
server turns into a clear lookup failure instead of the API server timing the webhook out.

Package presence reads the per-NodeWright node-state annotation (`nodewright.io/state.<name>`) of the
nodes labelled `nodewright.io/status.<name>`. The annotation is JSON; a package counts as present when
any entry names it (an entry keyed `<package>|<version>`, or an object whose `name` is the package) and
is not recorded as uninstalled. Decoding is injectable so the node-state codec can be plugged in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nodewright.api import constants, nodestate
from nodewright.webhook.server import LookupError_

REQUEST_TIMEOUT_S = 5.0


def packages_in_state(annotation: str) -> set[str]:
    """Names of the packages with an entry in a node-state annotation (an entry = files on the host).

    Uses the operator's own codec. A state that cannot be parsed is a lookup failure: the caller fails
    closed (it cannot prove the package is gone, so an uninstall-protected change is refused).
    """
    try:
        state = nodestate.decode(annotation)
    except nodestate.MalformedNodeState as exc:
        raise LookupError_(f"node state cannot be parsed: {exc}") from exc
    return {entry.name for entry in state.packages}


class KubeFacts:
    """`AdmissionFacts` over a kubernetes_asyncio ApiClient."""

    def __init__(
        self, api_client: Any, *, decode: Callable[[str], Iterable[str]] = packages_in_state
    ) -> None:
        from kubernetes_asyncio import client

        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._decode = decode

    async def policy_exists(self, name: str) -> bool:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self._custom.get_cluster_custom_object(
                constants.GROUP,
                constants.VERSION,
                constants.PLURAL_POLICY,
                name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise LookupError_(f"GET deploymentpolicy {name}: HTTP {exc.status}") from exc
        except TimeoutError as exc:
            raise LookupError_(f"GET deploymentpolicy {name}: timeout") from exc
        return True

    async def nodewrights_using_policy(self, name: str) -> list[str]:
        from kubernetes_asyncio.client.exceptions import ApiException

        users: list[str] = []
        token: str | None = None
        try:
            while True:
                page = await self._custom.list_cluster_custom_object(
                    constants.GROUP,
                    constants.VERSION,
                    constants.PLURAL_NODEWRIGHT,
                    limit=500,
                    _continue=token or "",
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                users.extend(
                    item["metadata"]["name"]
                    for item in page.get("items", [])
                    if (item.get("spec") or {}).get("deploymentPolicy") == name
                )
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return users
        except ApiException as exc:
            raise LookupError_(f"LIST nodewrights: HTTP {exc.status}") from exc
        except TimeoutError as exc:
            raise LookupError_("LIST nodewrights: timeout") from exc

    async def nodewrights(self) -> list[dict[str, Any]]:
        """Every NodeWright (`webhook.conflicts` compares their host settings)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        found: list[dict[str, Any]] = []
        token: str | None = None
        try:
            while True:
                page = await self._custom.list_cluster_custom_object(
                    constants.GROUP,
                    constants.VERSION,
                    constants.PLURAL_NODEWRIGHT,
                    limit=500,
                    _continue=token or "",
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                found.extend(item for item in page.get("items", []) if isinstance(item, dict))
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return found
        except ApiException as exc:
            raise LookupError_(f"LIST nodewrights: HTTP {exc.status}") from exc
        except TimeoutError as exc:
            raise LookupError_("LIST nodewrights: timeout") from exc

    async def selects_any_node(self, label_selector: str) -> bool:
        """Whether some node matches `label_selector` (one LIST with limit=1: never the whole fleet)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            page = await self._core.list_node(
                label_selector=label_selector, limit=1, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            raise LookupError_(f"LIST nodes {label_selector!r}: HTTP {exc.status}") from exc
        except TimeoutError as exc:
            raise LookupError_(f"LIST nodes {label_selector!r}: timeout") from exc
        return bool(page.items)

    async def package_present(self, nodewright: str, package: str) -> bool:
        from kubernetes_asyncio.client.exceptions import ApiException

        key = constants.state_annotation(nodewright)
        token: str | None = None
        try:
            while True:
                page = await self._core.list_node(
                    label_selector=constants.status_label(nodewright),
                    limit=500,
                    _continue=token or "",
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                for node in page.items:
                    annotation = (node.metadata.annotations or {}).get(key)
                    if annotation and package in set(self._decode(annotation)):
                        return True
                token = page.metadata._continue
                if not token:
                    return False
        except ApiException as exc:
            raise LookupError_(f"LIST nodes: HTTP {exc.status}") from exc
        except TimeoutError as exc:
            raise LookupError_("LIST nodes: timeout") from exc
