"""Maintenance windows (nodewright/plan/windows.py): time arithmetic with the time passed in.

Examples pin the cases people get wrong (a window crossing midnight, DST changes in both directions,
"fifth Monday" months, blackouts); properties check that `evaluate` agrees with `is_open` at the moments
it names and in between.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.models import Blackout, Maintenance, MaintenanceWindow
from nodewright.api.schedules import maintenance_problems
from nodewright.plan.windows import compile_schedule, evaluate, is_open, next_opening, parse_duration


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def schedule(*windows: tuple[str, str], tz: str = "Europe/Berlin", blackouts: tuple[Blackout, ...] = ()):  # type: ignore[no-untyped-def]
    return compile_schedule(
        Maintenance(
            time_zone=tz,
            windows=[MaintenanceWindow(schedule=c, duration=d) for c, d in windows] or None,
            blackouts=list(blackouts) or None,
        )
    )


def test_no_maintenance_is_always_open() -> None:
    state = evaluate(compile_schedule(None), at("2026-01-01T00:00:00Z"))
    assert state.active and state.closes_at is None and state.next_open is None


def test_window_crossing_midnight() -> None:
    s = schedule(("0 22 * * *", "4h"))  # 22:00-02:00 Berlin (UTC+1 in winter)
    assert not is_open(s, at("2026-12-01T20:59:00Z"))
    assert is_open(s, at("2026-12-01T21:00:00Z"))
    assert is_open(s, at("2026-12-02T00:59:59Z"))  # 01:59:59 local, next day
    assert not is_open(s, at("2026-12-02T01:00:00Z"))
    state = evaluate(s, at("2026-12-01T23:30:00Z"))
    assert state.active and state.closes_at == at("2026-12-02T01:00:00Z")
    closed = evaluate(s, at("2026-12-02T12:00:00Z"))
    assert not closed.active and closed.next_open == at("2026-12-02T21:00:00Z")


def test_duration_is_elapsed_time_across_spring_forward() -> None:
    # 2026-03-29: Berlin jumps 02:00 -> 03:00. A window opening 01:00 local for 3 h closes 05:00 local.
    s = schedule(("0 1 * * *", "3h"))
    opened = at("2026-03-29T00:00:00Z")  # 01:00 CET
    assert evaluate(s, opened).closes_at == opened + timedelta(hours=3)
    assert is_open(s, at("2026-03-29T02:59:00Z")) and not is_open(s, at("2026-03-29T03:00:00Z"))


def test_start_time_skipped_by_spring_forward_fires_after_the_gap() -> None:
    s = schedule(("30 2 * * *", "1h"))  # 02:30 does not exist on 2026-03-29 in Berlin
    nxt = next_opening(s, at("2026-03-28T23:00:00Z"))
    assert nxt == at("2026-03-29T01:00:00Z")  # 03:00 CEST, the first minute after the gap


def test_start_time_repeated_by_fall_back_fires_once() -> None:
    s = schedule(("30 2 * * *", "10m"))  # 02:30 happens twice on 2026-10-25 in Berlin
    first = next_opening(s, at("2026-10-24T22:00:00Z"))
    assert first == at("2026-10-25T00:30:00Z")  # 02:30 CEST
    after = next_opening(s, first + timedelta(minutes=10))
    assert after == at("2026-10-26T01:30:00Z")  # next day 02:30 CET, not the repeated hour


def test_fifth_weekday_only_in_months_that_have_one() -> None:
    s = schedule(("0 2 * * MON#5", "2h"), tz="UTC")
    opens = []
    moment = at("2026-01-01T00:00:00Z")
    for _ in range(4):
        nxt = next_opening(s, moment)
        assert nxt is not None
        opens.append(nxt.date().isoformat())
        moment = nxt + timedelta(hours=2)
    assert opens == ["2026-03-30", "2026-06-29", "2026-08-31", "2026-11-30"]


def test_blackout_closes_windows_and_next_open_is_after_it() -> None:
    s = schedule(
        ("0 22 * * *", "4h"), blackouts=(Blackout(start="2026-12-24", end="2026-12-26", reason="xmas"),)
    )
    state = evaluate(s, at("2026-12-24T21:30:00Z"))
    assert not state.active and state.blackout and "xmas" in state.blackout
    assert state.next_open == at("2026-12-26T23:00:00Z")  # blackout ends 27th 00:00 local, mid-window
    # A window open when a blackout starts closes at the blackout's start.
    assert evaluate(s, at("2026-12-23T22:00:00Z")).closes_at == at("2026-12-23T23:00:00Z")


def test_several_windows_and_per_window_time_zone() -> None:
    m = Maintenance(
        time_zone="UTC",
        windows=[
            MaintenanceWindow(schedule="0 9 * * *", duration="1h", time_zone="America/New_York"),
            MaintenanceWindow(schedule="0 9 * * *", duration="1h"),
        ],
    )
    s = compile_schedule(m)
    assert is_open(s, at("2026-07-01T09:30:00Z")) and is_open(s, at("2026-07-01T13:30:00Z"))
    assert not is_open(s, at("2026-07-01T11:00:00Z"))


def test_unreadable_schedule_fails_closed_and_the_webhook_names_the_field() -> None:
    m = Maintenance(
        time_zone="Mars/Olympus", windows=[MaintenanceWindow(schedule="0 25 * * *", duration="1h")]
    )
    state = evaluate(compile_schedule(m), at("2026-01-01T00:00:00Z"))
    assert not state.active and state.error
    problems = dict(maintenance_problems(m.to_json_dict(), "spec.maintenance"))
    assert set(problems) == {"spec.maintenance.timeZone", "spec.maintenance.windows[0].schedule"}


def test_parse_duration() -> None:
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("0") == timedelta(0)


# ----------------------------------------------------------------------------------------------------
# Properties

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Sao_Paulo",
]
CRONS = st.sampled_from(
    [
        "0 22 * * *",
        "30 1 * * *",
        "0 2 * * 1-5",
        "15 3 * * SUN",
        "0 2 * * TUE#2",
        "0 0 1 * *",
        "0 2 * * MON#5",
        "*/30 * * * *",
        "0 23 L * *",
    ]
)
MOMENTS = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2028, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=150, deadline=None)
@given(
    cron=CRONS,
    hours=st.integers(1, 30),
    tz=st.sampled_from(ZONES),
    now=MOMENTS,
    probes=st.lists(st.floats(0, 1, exclude_max=True), max_size=6),
    blackout=st.booleans(),
)
def test_evaluate_agrees_with_is_open_at_and_between_the_moments_it_names(
    cron: str, hours: int, tz: str, now: datetime, probes: list[float], blackout: bool
) -> None:
    day = now.date()
    blackouts = (
        Blackout(start=(day + timedelta(days=1)).isoformat(), end=(day + timedelta(days=3)).isoformat()),
    )
    s = schedule((cron, f"{hours}h"), tz=tz, blackouts=blackouts if blackout else ())
    state = evaluate(s, now)
    assert state.active == is_open(s, now)
    if state.active:
        assert state.closes_at is not None and state.closes_at > now
        assert is_open(s, state.closes_at - timedelta(seconds=1))
        for p in probes:
            moment = now + (state.closes_at - now) * p
            if moment < state.closes_at:  # (microsecond rounding of the product)
                assert is_open(s, moment)
    else:
        assert state.next_open is not None and state.next_open > now  # every schedule fires within 400 days
        assert is_open(s, state.next_open)
        for p in probes:
            moment = now + (state.next_open - now) * p
            if moment < state.next_open:
                assert not is_open(s, moment)


@settings(max_examples=100, deadline=None)
@given(hour=st.integers(0, 23), minutes=st.integers(30, 600), tz=st.sampled_from(ZONES), now=MOMENTS)
def test_a_daily_window_is_open_for_exactly_its_duration_of_elapsed_time(
    hour: int, minutes: int, tz: str, now: datetime
) -> None:
    s = schedule((f"0 {hour} * * *", f"{minutes}m"), tz=tz)
    opens = next_opening(s, now) if not is_open(s, now) else None
    if opens is None:
        return
    assert is_open(s, opens + timedelta(minutes=minutes) - timedelta(seconds=1))
    if minutes < 22 * 60:  # the next day's occurrence cannot have started yet
        assert not is_open(s, opens + timedelta(minutes=minutes))


@pytest.mark.parametrize("cron", ["61 * * * *", "0 2 * * FUNDAY", "0 2 * 13 *"])
def test_bad_cron_is_reported(cron: str) -> None:
    m = Maintenance(windows=[MaintenanceWindow(schedule=cron, duration="1h")])
    assert maintenance_problems(m.to_json_dict(), "spec.maintenance")
