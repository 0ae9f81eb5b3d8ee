"""Per-version package ConfigMaps, mounted by package pods at `/skyhook-package/configmaps`.

One ConfigMap `<nw>-<pkg>-<ver>` (`podspec.package_configmap_name`) per package version, in the
operator namespace, holding the package's `configMap` data. It must exist with the current data before
a pod that mounts it is created: the kubelet does not start a pod whose ConfigMap volume is missing
(the pod sits in `ContainerCreating`), and a pod started with stale data would apply the wrong config.

Kubernetes behaviour handled:

- Cluster-scoped owner, namespaced dependent: a namespaced object may name a cluster-scoped owner (the
  NodeWright), so the garbage collector deletes the ConfigMaps when the NodeWright goes. The owner
  reference carries the NodeWright's uid; a ConfigMap left over from an earlier NodeWright of the same
  name (another uid) is taken over by replacing it.
- Create first (the common case is "does not exist yet"); on `409 AlreadyExists` read it and replace it
  only if data, labels or owner differ (PUT with the read resourceVersion; `modify` re-reads on
  `409 Conflict`).
- What was written is cached by name → digest of (data, owner uid), so steady-state reconciles issue no
  request at all. The cache is only a shortcut: after a restart the first ensure re-reads.
- Old versions: once a rollout is complete, the ConfigMaps of versions that left the spec are deleted
  (`prune`, called by the rollout controller; needs `list` and `delete` on ConfigMaps in the operator
  namespace). Until then an old version's pods may still need theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from typing import Final

import structlog

from nodewright.api import constants
from nodewright.api.models import NodeWright, Package
from nodewright.kube.client import KubeClient
from nodewright.kube.resources import JSON, ApiError, Conflict, NotFound, Resource
from nodewright.plan import podspec

log = structlog.get_logger("nodewright.controller.configmaps")

CONFIGMAPS: Final = Resource("", "v1", "configmaps", True, "ConfigMap")


def desired_configmap(nw: NodeWright, package_name: str, package: Package, *, namespace: str) -> JSON:
    name = podspec.package_configmap_name(nw.metadata.name, package_name, package.version)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
                constants.POD_LABEL_NODEWRIGHT: nw.metadata.name,
                constants.POD_LABEL_PACKAGE: package_name,
                constants.POD_LABEL_VERSION: podspec.label_value(package.version),
            },
            "ownerReferences": [
                {
                    "apiVersion": constants.API_VERSION,
                    "kind": constants.KIND_NODEWRIGHT,
                    "name": nw.metadata.name,
                    "uid": nw.metadata.uid or "",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": dict(package.config_map or {}),
    }


def _digest(data: Mapping[str, str], owner_uid: str) -> str:
    canonical = json.dumps({"d": dict(data), "o": owner_uid}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _up_to_date(current: JSON, desired: JSON) -> bool:
    cmeta, dmeta = current.get("metadata") or {}, desired["metadata"]
    owners = {o.get("uid") for o in cmeta.get("ownerReferences") or []}
    labels = cmeta.get("labels") or {}
    return (
        (current.get("data") or {}) == desired["data"]
        and dmeta["ownerReferences"][0]["uid"] in owners
        and all(labels.get(k) == v for k, v in dmeta["labels"].items())
    )


class PackageConfigMaps:
    def __init__(self, client: KubeClient, *, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._written: dict[str, str] = {}

    async def ensure(self, nw: NodeWright, package_name: str, package: Package) -> str:
        """Create or update the package's ConfigMap; returns its name."""
        desired = desired_configmap(nw, package_name, package, namespace=self._namespace)
        name = str(desired["metadata"]["name"])
        digest = _digest(desired["data"], nw.metadata.uid or "")
        if self._written.get(name) == digest:
            return name
        try:
            await self._client.create(CONFIGMAPS, desired, namespace=self._namespace)
            log.info("package configmap created", configmap=name)
        except Conflict as exc:
            if not exc.already_exists:
                raise

            def mutate(current: JSON) -> JSON | None:
                if _up_to_date(current, desired):
                    return None
                merged = dict(desired)
                merged["metadata"] = {**desired["metadata"]}
                return merged

            await self._client.modify(CONFIGMAPS, name, mutate, namespace=self._namespace)
        self._written[name] = digest
        return name

    def forget(self, name: str) -> None:
        self._written.pop(name, None)

    async def prune(self, nw: NodeWright, *, keep: set[str]) -> bool:
        """Delete this NodeWright's package ConfigMaps whose name is not in `keep` (versions that left
        the spec); True when done. Only ConfigMaps owned by this NodeWright's uid are touched; the log
        store's (`controller.logstore`) carry no package label and are never listed here."""
        selector = f"{constants.POD_LABEL_NODEWRIGHT}={nw.metadata.name},{constants.POD_LABEL_PACKAGE}"
        try:
            listed = await self._client.list(CONFIGMAPS, namespace=self._namespace, label_selector=selector)
            for item in listed.items:
                meta = item.get("metadata") or {}
                name = str(meta.get("name") or "")
                owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
                if name in keep or nw.metadata.uid not in owners:
                    continue
                with contextlib.suppress(NotFound):
                    await self._client.delete(
                        CONFIGMAPS, name, namespace=self._namespace, uid=meta.get("uid")
                    )
                self.forget(name)
                log.info("old package configmap deleted", configmap=name, nodewright=nw.metadata.name)
        except ApiError as exc:
            log.warning("old package configmaps not pruned", nodewright=nw.metadata.name, error=str(exc))
            return False
        return True
