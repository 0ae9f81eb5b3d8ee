"""Kubernetes label-selector matching (metav1.LabelSelector), pure.

Used for `podNonInterruptLabels` (which pods on a node protect it from an interrupt) and by the rollout
planner for compartment selectors. Semantics follow apimachinery's `LabelSelectorAsSelector`:

- `matchLabels` entries are ANDed equality requirements.
- `matchExpressions`: `In` (label present with one of the values), `NotIn` (label absent, or present
  with a value not listed), `Exists` (key present), `DoesNotExist` (key absent); all ANDed.
- A nil or empty selector matches everything. Callers that give "empty" another meaning (an empty
  `podNonInterruptLabels` means "no pod is protected") must check `is_empty` first.

Whether a selector matches depends only on the labels it names (`keys`): two label sets with the same
values (or absences) at those keys match the same selectors, which lets the rollout planner match a
fleet's distinct label combinations once instead of every node on every pass.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodewright.api.models import LabelSelector, LabelSelectorRequirement


def is_empty(selector: LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


def keys(selector: LabelSelector | None) -> frozenset[str]:
    """The label keys `matches` reads for this selector (nothing else of the labels matters)."""
    if selector is None:
        return frozenset()
    return frozenset(selector.match_labels or {}) | {r.key for r in selector.match_expressions or []}


def _requirement(req: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    values = req.values or []
    if req.operator == "In":
        return req.key in labels and labels[req.key] in values
    if req.operator == "NotIn":
        return req.key not in labels or labels[req.key] not in values
    if req.operator == "Exists":
        return req.key in labels
    return req.key not in labels  # DoesNotExist


def matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return True
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    return all(_requirement(r, labels) for r in selector.match_expressions or [])
