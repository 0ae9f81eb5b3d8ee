"""Maintenance windows: whether a compartment may admit nodes at a given moment, and when that changes.

A compartment's `Maintenance` (DeploymentPolicy `spec.maintenance`, or the compartment's own) lists
windows and blackout days. The rollout planner admits a node only while a window is open and no
blackout covers the moment; nodes admitted before a window closes finish their work afterwards (a
half-done node is worse than a late one).

- A window *occurrence* starts at every time its cron schedule fires, evaluated in its IANA time zone,
  and lasts `duration` of elapsed time: `0 22 * * *` with `4h` is open 22:00-02:00 and crosses midnight;
  across a DST change it is still 4 hours long, so it ends at 01:00 or 03:00 wall-clock time.
- The cron fields are evaluated by `cronsim` (a maintained cron evaluator: `L`, `#` and `W`, day names,
  and Debian cron's DST rules: a start time skipped by a spring-forward change fires at the first
  minute after the gap, one repeated by a fall-back change fires once). `MON#5` fires only in months
  with five Mondays.
- A blackout covers whole days, `start` 00:00 to the end of `end`, in the maintenance time zone; one
  that reaches the end of the calendar (`end: 9999-12-31`, "until further notice") never ends.
- No windows means "always open" (blackouts still apply); no maintenance at all means always open.
- A schedule or time zone that cannot be read makes that window never open (fail closed) and is
  reported in `error`; the webhook refuses such policies, so this only meets objects that bypassed it.
  A blackout day that does not exist (`2026-02-30`) is refused by the models already (the controller
  reports such a policy as invalid, `plan.policy.PolicyInvalid`); should one reach this module anyway,
  that blackout covers every moment (fail closed) and is reported the same way.

Everything takes the moment as a parameter (no clock reads) and is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim

from nodewright.api.dates import parse_date
from nodewright.api.models import Maintenance
from nodewright.api.schedules import cron_problem

HORIZON = timedelta(days=400)
"""How far ahead the next opening is searched (a yearly schedule plus a long blackout)."""
MAX_FIRES = 20_000
"""Fire times examined per window and query: bounds the cost of a schedule like `* * * * *`."""
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


class WindowError(ValueError):
    """A schedule, duration or time zone that cannot be evaluated."""


@dataclass(frozen=True, slots=True)
class Window:
    """One parsed window: cron expression, elapsed duration and zone."""

    schedule: str
    duration: timedelta
    zone: ZoneInfo


@dataclass(frozen=True, slots=True)
class BlackoutDays:
    """A blackout as a half-open UTC interval [start, end)."""

    start: datetime
    end: datetime
    label: str


@dataclass(frozen=True, slots=True)
class Schedule:
    """The windows and blackouts of one compartment, ready to evaluate."""

    windows: tuple[Window, ...]
    blackouts: tuple[BlackoutDays, ...]
    always: bool
    """No window is declared: open whenever no blackout applies."""
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowState:
    """Whether admission is allowed at `now`, and the next change.

    `closes_at` is when the open window ends (None when always open), `next_open` when the next window
    opens (None when open now, or when none opens within `HORIZON`); `blackout` names the blackout that
    keeps it closed, if one does.
    """

    active: bool
    closes_at: datetime | None
    next_open: datetime | None
    blackout: str | None = None
    error: str | None = None

    def describe(self) -> str:
        if self.active:
            return "maintenance window open" + (f" until {_ts(self.closes_at)}" if self.closes_at else "")
        why = f"blackout {self.blackout}" if self.blackout else "no maintenance window open"
        if self.error:
            why += f" ({self.error})"
        nxt = f"; next opens {_ts(self.next_open)}" if self.next_open else "; none opens within 400 days"
        return why + nxt


def parse_duration(text: str) -> timedelta:
    """Go duration (`4h`, `90m`, `1h30m`, `0`) as a timedelta; raises WindowError."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    if text == "0":
        return timedelta(0)
    total, number, i = 0.0, "", 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = next((u for u in ("ns", "us", "µs", "ms", "s", "m", "h") if text.startswith(u, i)), None)
        if unit is None or not number:
            raise WindowError(f"duration {text!r}: expected a Go duration such as 4h or 1h30m")
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    if number:
        raise WindowError(f"duration {text!r}: a number needs a unit (s, m, h)")
    return timedelta(seconds=total)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; raises WindowError for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise WindowError(f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin") from exc


def compile_schedule(maintenance: Maintenance | None) -> Schedule:
    """Parse a Maintenance; unreadable windows are left out and listed in `errors` (they never open)."""
    if maintenance is None:
        return Schedule((), (), always=True)
    errors: list[str] = []
    windows: list[Window] = []
    default_zone: ZoneInfo | None = None
    try:
        default_zone = zone(maintenance.time_zone)
    except WindowError as exc:
        errors.append(str(exc))
    for index, spec in enumerate(maintenance.windows or ()):
        try:
            tz = zone(spec.time_zone) if spec.time_zone else default_zone
            if tz is None:
                raise WindowError(f"unknown time zone {maintenance.time_zone!r}")
            problem = cron_problem(spec.schedule)
            if problem:
                raise WindowError(problem)
            duration = parse_duration(spec.duration)
            if duration <= timedelta(0):
                raise WindowError(f"duration {spec.duration!r} must be positive")
            windows.append(Window(spec.schedule, duration, tz))
        except WindowError as exc:
            errors.append(f"windows[{index}]: {exc}")
    blackouts: list[BlackoutDays] = []
    for index, spec_b in enumerate(maintenance.blackouts or ()):
        label = f"{spec_b.start}..{spec_b.end}" + (f" ({spec_b.reason})" if spec_b.reason else "")
        try:
            first, last = parse_date(spec_b.start), parse_date(spec_b.end)
        except ValueError as exc:
            errors.append(f"blackouts[{index}]: {exc}")
            blackouts.append(BlackoutDays(EARLIEST, LATEST, label))  # fail closed: it may cover any day
            continue
        tz = default_zone or ZoneInfo("UTC")
        blackouts.append(BlackoutDays(_midnight(first, tz), _midnight(last, tz, after=True), label))
    declared = bool(maintenance.windows)
    return Schedule(tuple(windows), tuple(blackouts), always=not declared, errors=tuple(errors))


def _midnight(day: date, tz: ZoneInfo, *, after: bool = False) -> datetime:
    """The start of `day` (of the day after it, with `after`) in `tz`, in UTC; the ends of the calendar
    are clamped (a blackout to 9999-12-31 lasts for ever, one from 0001-01-01 east of UTC began then)."""
    if after and day == date.max:
        return LATEST
    try:
        return datetime.combine(day + timedelta(days=int(after)), time(0), tzinfo=tz).astimezone(UTC)
    except OverflowError:
        return EARLIEST if day.year == date.min.year else LATEST


def _fires_after(window: Window, moment: datetime) -> Iterator[datetime]:
    """Fire times of `window` strictly after `moment`, as UTC datetimes."""
    local = moment.astimezone(window.zone)
    for count, fire in enumerate(CronSim(window.schedule, local)):
        if count >= MAX_FIRES:
            return
        yield fire.astimezone(UTC)


def _occurrence_at(window: Window, moment: datetime) -> tuple[datetime, datetime] | None:
    """The occurrence of `window` containing `moment` (the latest one if several overlap)."""
    found: tuple[datetime, datetime] | None = None
    # An occurrence [t, t + d) contains `moment` iff moment - d < t <= moment.
    for fire in _fires_after(window, moment - window.duration):
        if fire > moment:
            break
        found = (fire, fire + window.duration)
    return found


def _blackout_at(schedule: Schedule, moment: datetime) -> BlackoutDays | None:
    return next((b for b in schedule.blackouts if b.start <= moment < b.end), None)


def is_open(schedule: Schedule, moment: datetime) -> bool:
    """Admission allowed at `moment` (timezone-aware)."""
    if _blackout_at(schedule, moment) is not None:
        return False
    if schedule.always:
        return True
    return any(_occurrence_at(w, moment) is not None for w in schedule.windows)


def evaluate(schedule: Schedule, now: datetime) -> WindowState:
    """Whether `schedule` allows admission at `now`, when that ends, or when it next begins."""
    now = now.astimezone(UTC)
    error = "; ".join(schedule.errors) or None
    blackout = _blackout_at(schedule, now)
    if blackout is None and schedule.always:
        upcoming = [b.start for b in schedule.blackouts if b.start > now]
        return WindowState(True, min(upcoming, default=None), None, error=error)
    occurrences = [o for o in (_occurrence_at(w, now) for w in schedule.windows) if o is not None]
    if blackout is None and occurrences:
        ends = max(end for _, end in occurrences)
        cut = [b.start for b in schedule.blackouts if now < b.start < ends]
        return WindowState(True, min([ends, *cut]), None, error=error)
    return WindowState(
        False,
        None,
        next_opening(schedule, now),
        blackout=blackout.label if blackout is not None else None,
        error=error,
    )


def next_opening(schedule: Schedule, now: datetime) -> datetime | None:
    """The first moment after `now` at which admission is allowed, within `HORIZON`."""
    limit = now + HORIZON
    candidates: list[datetime] = [b.end for b in schedule.blackouts if now < b.end <= limit]
    for window in schedule.windows:
        for fire in _fires_after(window, now):
            if fire > limit:
                break
            candidates.append(fire)
            if _blackout_at(schedule, fire) is None:
                break  # later fires of this window cannot open earlier than this one
    for moment in sorted(set(candidates)):
        if is_open(schedule, moment):
            return moment
    return None


def _ts(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else "-"
