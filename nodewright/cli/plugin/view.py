"""The live progress screen of `watch` and `make demo` (pure: documents in, lines out).

One block per NodeWright: a head line (status, pause/disable, nodes per status), one bar per
compartment (complete/matched, slots in use against the ceiling, current batch, halted or the
compartment's message), the nodes that need a look with the reason the planner gives (protected pods,
a PodDisruptionBudget refusing an eviction, erroring, blocked, unavailable, waiting for an earlier
NodeWright, ...), the waiting reasons counted, and the newest Events. The input is `status_doc` (the
planner run on the cluster as it is, see `explain`), so the screen says what the operator will do,
for any cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

JSON = dict[str, Any]
FULL, EMPTY = "█", "░"
ATTENTION = ("ProtectedPods", "DrainBlocked", "DrainTimeout", "Erroring", "Blocked", "NodeUnavailable",
             "StateMalformed", "WaitingForPriority", "CompartmentHalted", "PolicyNotFound")  # fmt: skip


def bar(done: int, total: int, *, width: int = 24) -> str:
    if total <= 0:
        return "·" * width
    filled = min(width, round(width * done / total))
    return FULL * filled + EMPTY * (width - filled)


def clock(seconds: float) -> str:
    whole = int(seconds)
    return (
        f"{whole // 3600:d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
        if whole >= 3600
        else f"{whole // 60:02d}:{whole % 60:02d}"
    )


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def nodewright_block(
    doc: Mapping[str, Any],
    *,
    events: Sequence[Mapping[str, Any]] = (),
    width: int = 120,
    attention_rows: int = 6,
    event_rows: int = 4,
) -> list[str]:
    flags = [f for f in ("paused", "disabled") if doc.get(f)]
    nodes = doc.get("nodes") or {}
    counts = "  ".join(f"{k} {v}" for k, v in sorted(nodes.items()))
    head = (
        f"{doc['name']}: {doc.get('status', 'unknown')}{' (' + ', '.join(flags) + ')' if flags else ''}"
        f"   {doc.get('matched', 0)} nodes   {counts}"
    )
    lines = [_fit(head, width)]
    name_width = max([11, *(len(str(c["name"])) for c in doc.get("compartments") or [])])
    bar_width = max(10, min(30, width - name_width - 60))
    for comp in doc.get("compartments") or []:
        if not comp.get("matched"):
            continue
        state = "HALTED" if comp.get("halted") else str(comp.get("message") or "")
        done, total = int(comp["completed"]), int(comp["matched"])
        slots = f"slots {comp['slotsUsed']:>3}/{comp['ceiling']:<3}"
        lines.append(
            _fit(
                f"  {comp['name']:<{name_width}} {bar(done, total, width=bar_width)} {done:>4}/{total:<4}"
                f" {slots} batch {comp['currentBatch']:<3} {state}",
                width,
            )
        )
    waiting = doc.get("waiting") or {}
    if waiting:
        lines.append(_fit("  waiting: " + ", ".join(f"{k} {v}" for k, v in sorted(waiting.items())), width))
    attention = [b for b in doc.get("blocked") or [] if b.get("reason") in ATTENTION]
    lines.extend(_fit(f"  ! {item['node']}: {item['summary']}", width) for item in attention[:attention_rows])
    if len(attention) > attention_rows:
        lines.append(
            f"  ! … and {len(attention) - attention_rows} more (kubectl nodewright node list {doc['name']})"
        )
    lines.extend(_fit(f"  HALTED {h['compartment']}: {h['message']}", width) for h in doc.get("halts") or [])
    for event in list(events)[-event_rows:]:
        stamp = str(event.get("lastTimestamp") or "")[11:19]
        count = int(event.get("count") or 1)
        times = f" x{count}" if count > 1 else ""
        lines.append(
            _fit(f"  {stamp} {event.get('reason', ''):<18}{times} {event.get('message', '')}", width)
        )
    return lines


def screen(
    docs: Sequence[Mapping[str, Any]],
    *,
    events: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    elapsed: float | None = None,
    title: str = "kubectl nodewright watch",
    width: int = 120,
    height: int | None = None,
    footer: str = "",
) -> list[str]:
    """The whole screen: a title line, then one block per NodeWright (cut to `height`)."""
    when = f"  {clock(elapsed)}" if elapsed is not None else ""
    lines = [_fit(f"{title}{when}", width)]
    if not docs:
        lines.append("  no NodeWright")
    for doc in docs:
        lines.append("")
        lines.extend(nodewright_block(doc, events=(events or {}).get(str(doc["name"]), ()), width=width))
    if footer:
        lines += ["", _fit(footer, width)]
    if height is not None and len(lines) > height:
        lines = [
            *lines[: max(1, height - 1)],
            _fit(f"… {len(lines) - height + 1} more lines (enlarge the terminal)", width),
        ]
    return lines
