"""Codec of the admission annotation `nodewright.io/batch.<nw>`: the rollout's permission for a node.

The rollout controller is the only writer of this annotation (it admits a node into a batch, and
removes the admission when it releases the node); the node controller reads it, and marks it
`consumed` in the same write that records the node settled under it (`plan.rollout`, "Admissions").
It sits beside the state annotation's codec (`api.nodestate`) because both controllers, `nodewright
plan` and `kubectl nodewright` read it the same way.

Wire format: compact JSON with sorted keys, `{"c": compartment, "b": batch (>= 1), "o": order (>= 0),
"f": spec fingerprint, "at": RFC 3339 time, "d": true (consumed; omitted when false)}`. Anything else
raises `MalformedAdmission`; readers treat such a value as no admission (it then starts nothing).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Final

from nodewright.api import constants

ADMISSION_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}batch."


def admission_annotation(nodewright: str) -> str:
    return f"{ADMISSION_ANNOTATION_PREFIX}{nodewright}"


@dataclass(frozen=True, slots=True)
class Admission:
    """Permission for a node to start work, persisted in the node's admission annotation.

    An admission allows one pass of the node to a settled state. `consumed` is set by the node
    controller in the same write that records the node complete or erroring: from then on the admission
    no longer lets the node start anything (a wiped state, a re-apply after reboot or a retry of an
    erroring package needs a fresh admission from a batch); it stays as the record of batch membership.
    """

    compartment: str
    batch: int
    order: int
    fingerprint: str
    at: str
    consumed: bool = False


class MalformedAdmission(ValueError):
    pass


def encode_admission(admission: Admission) -> str:
    doc: dict[str, object] = {
        "c": admission.compartment,
        "b": admission.batch,
        "o": admission.order,
        "f": admission.fingerprint,
        "at": admission.at,
    }
    if admission.consumed:
        doc["d"] = True
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


_ADMISSION_KEYS: Final = frozenset({"c", "b", "o", "f", "at"})


def decode_admission(text: str) -> Admission:
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not _ADMISSION_KEYS <= set(doc) <= _ADMISSION_KEYS | {"d"}:
            found = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise MalformedAdmission(f"expected keys c, b, o, f, at (and optionally d); got {found!r}")
        compartment, batch, order, fingerprint, at = doc["c"], doc["b"], doc["o"], doc["f"], doc["at"]
        consumed = doc.get("d", False)
        if not (
            isinstance(compartment, str)
            and isinstance(fingerprint, str)
            and isinstance(at, str)
            and type(batch) is int
            and type(order) is int
            and batch >= 1
            and order >= 0
            and isinstance(consumed, bool)
        ):
            raise MalformedAdmission("field types: c, f, at strings; b >= 1 and o >= 0 integers; d boolean")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, MalformedAdmission):
            raise
        raise MalformedAdmission(f"not JSON: {exc}") from exc
    # Every node of a rollout carries the same compartment and fingerprint, every node of a batch the
    # same time, and admissions outlive the rollout: one copy of each, not one per node.
    return Admission(
        compartment=sys.intern(compartment),
        batch=batch,
        order=order,
        fingerprint=sys.intern(fingerprint),
        at=sys.intern(at),
        consumed=consumed,
    )
