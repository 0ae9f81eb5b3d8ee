"""Checks of maintenance schedules that the CRD schema cannot express: cron syntax and IANA time zones.

The API server validates the shape of `maintenance` (patterns, lengths) and that blackout days exist
(a CEL rule, `nodewright.api.dates`); whether `0 2 * * TUE#2` is a cron expression and `Europe/Berlin` a
time zone needs a cron evaluator (cronsim, the one the rollout planner uses, `nodewright.plan.windows`)
and the zone database (zoneinfo, with the `tzdata` package where the system has none). The webhook
reports these problems with their field paths, and says why a blackout day does not exist ("February
2026 has 28 days") where the schema's message can only state the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from nodewright.api.dates import date_problem
from nodewright.api.models import DURATION_PATTERN

_ZERO = ("0", "0s", "0m", "0h")


def zone_problem(name: object) -> str | None:
    """Why `name` is not an IANA time zone, or None."""
    if not isinstance(name, str):
        return None  # the schema reports the type
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file
        return f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin or America/New_York"
    return None


def cron_problem(expression: object) -> str | None:
    """Why `expression` is not a cron schedule (five fields), or None."""
    if not isinstance(expression, str):
        return None
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        return (
            f"cron expression {expression!r} cannot be read ({exc}); five fields: minute hour"
            " day-of-month month day-of-week, e.g. '0 22 * * 1-5'"
        )
    return None


def maintenance_problems(maintenance: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """(field path, problem) for every schedule, duration, time zone or blackout day of `maintenance` that
    fails."""
    import re

    out: list[tuple[str, str]] = []
    if problem := zone_problem(maintenance.get("timeZone", "UTC")):
        out.append((f"{path}.timeZone", problem))
    windows = maintenance.get("windows")
    for index, window in enumerate(windows if isinstance(windows, list) else ()):
        if not isinstance(window, Mapping):
            continue
        wpath = f"{path}.windows[{index}]"
        if "timeZone" in window and (problem := zone_problem(window["timeZone"])):
            out.append((f"{wpath}.timeZone", problem))
        if problem := cron_problem(window.get("schedule")):
            out.append((f"{wpath}.schedule", problem))
        duration = window.get("duration")
        if isinstance(duration, str) and re.fullmatch(DURATION_PATTERN, duration) and _is_zero(duration):
            out.append((f"{wpath}.duration", "a window must stay open for a positive duration, e.g. 4h"))
    blackouts = maintenance.get("blackouts")
    for index, blackout in enumerate(blackouts if isinstance(blackouts, list) else ()):
        for key in ("start", "end") if isinstance(blackout, Mapping) else ():
            day = blackout.get(key)
            if isinstance(day, str) and (problem := date_problem(day)):
                out.append((f"{path}.blackouts[{index}].{key}", problem))
    return out


def _is_zero(duration: str) -> bool:
    return all(ch in "0.nsuµmh" for ch in duration) and not any(ch in "123456789" for ch in duration)
