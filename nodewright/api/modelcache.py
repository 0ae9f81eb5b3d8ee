"""NodeWright and DeploymentPolicy objects parsed into models once per resourceVersion.

A NodeWright that fails validation (the webhook was bypassed, or an older CRD) must not crash a
reconcile: the controller reports the error in the object's status and leaves its nodes alone. A
DeploymentPolicy that fails validation is reported on every NodeWright that uses it
(`api.reasons.PolicyInvalid`), with the webhook's own words. The operator, `nodewright plan` and
`kubectl nodewright` parse with this one cache, so an object one refuses, the others refuse too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from nodewright.api import constants, validation
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.reasons import PolicyInvalid

JSON = Mapping[str, Any]


@dataclass(slots=True)
class _Parsed:
    resource_version: str
    model: NodeWright | DeploymentPolicy | None
    problems: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        return "; ".join(self.problems) if self.model is None else None


MAX_PROBLEMS = 10


class ModelCache:
    """Parse cached objects into models once per resourceVersion; keep the validation problems if any.

    A NodeWright that fails validation (the webhook was bypassed, or an older CRD) must not crash a
    reconcile: the controller reports the error in the object's status and leaves its nodes alone. A
    DeploymentPolicy that fails validation (stored before a rule existed, e.g. a blackout on 2026-02-30)
    is reported on every NodeWright that uses it (`plan.policy.PolicyInvalid`), with the webhook's own
    words: each problem is `field path: what is wrong and what to do`.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Parsed] = {}

    def _parse(self, kind: str, obj: JSON) -> _Parsed:
        meta = obj.get("metadata") or {}
        key = (kind, str(meta.get("name")))
        rv = str(meta.get("resourceVersion") or "")
        cached = self._entries.get(key)
        if cached is not None and cached.resource_version == rv:
            return cached
        model_cls: type[NodeWright] | type[DeploymentPolicy] = (
            NodeWright if kind == constants.KIND_NODEWRIGHT else DeploymentPolicy
        )
        try:
            parsed = _Parsed(rv, model_cls.model_validate(obj))
        except pydantic.ValidationError as exc:
            parsed = _Parsed(rv, None, _problems(kind, obj, exc))
        self._entries[key] = parsed
        return parsed

    def nodewright(self, obj: JSON) -> tuple[NodeWright | None, str | None]:
        parsed = self._parse(constants.KIND_NODEWRIGHT, obj)
        model = parsed.model if isinstance(parsed.model, NodeWright) else None
        return model, parsed.error

    def policy(self, obj: JSON) -> tuple[DeploymentPolicy | None, str | None]:
        parsed = self._parse(constants.KIND_POLICY, obj)
        model = parsed.model if isinstance(parsed.model, DeploymentPolicy) else None
        return model, parsed.error

    def policy_or_problems(self, obj: JSON) -> DeploymentPolicy | PolicyInvalid:
        """The policy's model, or what is wrong with it (for the NodeWrights that use it)."""
        parsed = self._parse(constants.KIND_POLICY, obj)
        if isinstance(parsed.model, DeploymentPolicy):
            return parsed.model
        return PolicyInvalid(str((obj.get("metadata") or {}).get("name")), parsed.problems)

    def forget(self, kind: str, name: str) -> None:
        self._entries.pop((kind, name), None)


def _problems(kind: str, obj: JSON, exc: pydantic.ValidationError) -> tuple[str, ...]:
    """`field path: message` lines for an object the models refuse, at most `MAX_PROBLEMS`.

    For a policy these are the webhook's messages (they say why, e.g. "February 2026 has 28 days"); the
    problems the model itself raises are the fallback, and what a NodeWright gets (its webhook rules
    need cluster facts this cache does not have).
    """
    found = validation.validate_deploymentpolicy(obj).errors if kind == constants.KIND_POLICY else []
    found = found or validation.model_errors(exc)
    return tuple(str(e) for e in found[:MAX_PROBLEMS])
