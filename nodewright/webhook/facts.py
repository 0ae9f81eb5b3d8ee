"""Cluster lookups of the admission webhook, over the project's one Kubernetes client (`nodewright.kube`).

The webhook's client gives each call `REQUEST_TIMEOUT_S` with its retries (`webhook_client`), well below
the webhook's `timeoutSeconds` (10 s), so a slow API server turns into a clear lookup failure instead of
the API server timing the webhook out. Its errors are the client's (`kube.resources.ApiError`, transport
errors): one error type for one HTTP failure across operator, webhook and simulator.

Package presence reads the per-NodeWright node-state annotation (`nodewright.io/state.<name>`) of the
nodes labelled `nodewright.io/status.<name>`. The annotation is JSON; a package counts as present when
any entry names it (an entry keyed `<package>|<version>`, or an object whose `name` is the package) and
is not recorded as uninstalled. Decoding is injectable so the node-state codec can be plugged in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from nodewright.api import constants, nodestate
from nodewright.kube.client import KubeClient
from nodewright.kube.config import ClusterConfig
from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODES, NODEWRIGHTS, ApiError, NotFound
from nodewright.webhook.server import LookupError_

REQUEST_TIMEOUT_S = 5.0


def webhook_client(config: ClusterConfig) -> KubeClient:
    """The webhook's client: every call (its retries included) within `REQUEST_TIMEOUT_S`."""
    return KubeClient(config, timeout=REQUEST_TIMEOUT_S, call_deadline=REQUEST_TIMEOUT_S, max_retries=2)


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


def _lookup_failed(what: str, exc: Exception) -> LookupError_:
    """One line for a lookup the webhook could not make (it then fails closed where it must)."""
    if isinstance(exc, ApiError):
        return LookupError_(f"{what}: HTTP {exc.status}")
    return LookupError_(f"{what}: timeout" if isinstance(exc, TimeoutError) else f"{what}: {exc}")


LOOKUP_ERRORS = (ApiError, TimeoutError, aiohttp.ClientError)
"""What a lookup raises when the API server does not answer it (the one client's errors)."""


class KubeFacts:
    """`AdmissionFacts` over the project's Kubernetes client (`nodewright.kube.client.KubeClient`)."""

    def __init__(
        self, client: KubeClient, *, decode: Callable[[str], Iterable[str]] = packages_in_state
    ) -> None:
        self._client = client
        self._decode = decode

    async def policy_exists(self, name: str) -> bool:
        try:
            await self._client.get(DEPLOYMENTPOLICIES, name)
        except NotFound:
            return False
        except LOOKUP_ERRORS as exc:
            raise _lookup_failed(f"GET deploymentpolicy {name}", exc) from exc
        return True

    async def nodewrights_using_policy(self, name: str) -> list[str]:
        return [
            item["metadata"]["name"]
            for item in await self.nodewrights()
            if (item.get("spec") or {}).get("deploymentPolicy") == name
        ]

    async def nodewrights(self) -> list[dict[str, Any]]:
        """Every NodeWright (`webhook.conflicts` compares their host settings)."""
        try:
            listed = await self._client.list(NODEWRIGHTS)
        except LOOKUP_ERRORS as exc:
            raise _lookup_failed("LIST nodewrights", exc) from exc
        return [item for item in listed.items if isinstance(item, dict)]

    async def selects_any_node(self, label_selector: str) -> bool:
        """Whether some node matches `label_selector` (one LIST with limit=1: never the whole fleet)."""
        try:
            page = await self._client.list_page(NODES, label_selector=label_selector, limit=1)
        except LOOKUP_ERRORS as exc:
            raise _lookup_failed(f"LIST nodes {label_selector!r}", exc) from exc
        return bool(page.get("items"))

    async def package_present(self, nodewright: str, package: str) -> bool:
        key = constants.state_annotation(nodewright)
        token: str | None = None
        try:
            while True:
                page = await self._client.list_page(
                    NODES, label_selector=constants.status_label(nodewright), limit=500, continue_token=token
                )
                for node in page.get("items") or ():
                    annotation = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
                    if annotation and package in set(self._decode(annotation)):
                        return True
                token = (page.get("metadata") or {}).get("continue") or None
                if not token:
                    return False
        except LOOKUP_ERRORS as exc:
            raise _lookup_failed("LIST nodes", exc) from exc
