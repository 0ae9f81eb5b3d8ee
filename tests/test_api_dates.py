"""Blackout days that do not exist (issue 29 item 2): refused by the CRD schema, the models and the
webhook with the field path and what to write; the calendar expression agrees with `datetime.date`."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from nodewright.api import crdgen
from nodewright.api.dates import CALENDAR_DATE_MESSAGE, CALENDAR_DATE_PATTERN, date_problem, is_calendar_date
from nodewright.api.models import Blackout, DeploymentPolicy, Maintenance
from nodewright.api.validation import validate_deploymentpolicy
from nodewright.plan import windows


def _exists(year: int, month: int, day: int) -> bool:
    try:
        date(year, month, day)
    except ValueError:
        return False
    return True


@given(st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32))
def test_the_calendar_expression_is_the_calendar(year: int, month: int, day: int) -> None:
    text = f"{year:04d}-{month:02d}-{day:02d}"
    assert is_calendar_date(text) is _exists(year, month, day)
    assert (date_problem(text) is None) is _exists(year, month, day)


@given(st.text(max_size=12))
def test_any_text_gets_the_same_verdict_from_the_expression_and_the_words(text: str) -> None:
    assert is_calendar_date(text) is (date_problem(text) is None)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("2028-02-29", True),
        ("2000-02-29", True),  # divisible by 400
        ("1900-02-29", False),  # a century
        ("2100-02-29", False),
        ("2027-02-29", False),
        ("2026-02-30", False),
        ("2026-04-31", False),
        ("2026-12-31", True),
        ("9999-12-31", True),
        ("0001-01-01", True),
        ("0000-01-01", False),
        ("2026-02-28\n", False),  # Go's $ is the end of the text
    ],
)
def test_examples(text: str, ok: bool) -> None:
    assert is_calendar_date(text) is ok
    assert re.search(CALENDAR_DATE_PATTERN, text) is not None or not ok


def test_the_words_say_what_exists() -> None:
    assert date_problem("2027-02-29") == (
        "'2027-02-29' does not exist: February 2027 has 28 days (not a leap year); write a day from"
        " 2027-02-01 to 2027-02-28"
    )
    assert date_problem("2026-04-31") == (
        "'2026-04-31' does not exist: April 2026 has 30 days; write a day from 2026-04-01 to 2026-04-30"
    )
    assert "no month 13" in str(date_problem("2026-13-01"))
    assert "write YYYY-MM-DD" in str(date_problem("2026/01/02"))


# Every place a Maintenance can be: the policy, its default and a compartment.
LEVELS = ["spec.maintenance", "spec.default.maintenance", "spec.compartments[0].maintenance"]


def _policy(level: str, blackout: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {}}},
        "compartments": [
            {"name": "gpu", "selector": {"matchLabels": {"gpu": "true"}}, "budget": {"count": 1}}
        ],
    }
    maintenance = {"timeZone": "Europe/Berlin", "blackouts": [blackout]}
    if level == "spec.maintenance":
        spec["maintenance"] = maintenance
    elif level == "spec.default.maintenance":
        spec["default"]["maintenance"] = maintenance
    else:
        spec["compartments"][0]["maintenance"] = maintenance
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": "freeze"},
        "spec": spec,
    }


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    ("blackout", "field", "why"),
    [
        ({"start": "2026-02-30", "end": "2026-03-02"}, "start", "February 2026 has 28 days"),
        ({"start": "2027-02-01", "end": "2027-02-29"}, "end", "February 2027 has 28 days (not a leap year)"),
        ({"start": "2026-04-31", "end": "2026-05-02"}, "start", "April 2026 has 30 days"),
    ],
)
def test_the_webhook_refuses_a_day_that_does_not_exist(
    level: str, blackout: dict[str, str], field: str, why: str
) -> None:
    result = validate_deploymentpolicy(_policy(level, blackout))
    path = f"{level}.blackouts[0].{field}"
    assert [str(e.path) for e in result.errors] == [path], result.errors
    message = result.errors[0].message
    assert why in message and "write a day from" in message


@pytest.mark.parametrize("level", LEVELS)
def test_the_models_refuse_it_with_the_rule_of_the_schema(level: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"start: {CALENDAR_DATE_MESSAGE}")):
        DeploymentPolicy.model_validate(_policy(level, {"start": "2026-02-30", "end": "2026-03-02"}))
    DeploymentPolicy.model_validate(_policy(level, {"start": "2028-02-29", "end": "9999-12-31"}))


def _date_fields(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """String properties that hold a date or a time, by description or format, with their path."""
    found = []
    if schema.get("type") == "string":
        text = str(schema.get("description", ""))
        if "YYYY-MM-DD" in text or "RFC 3339" in text or "format" in schema:
            found.append((path, schema))
    for name, child in (schema.get("properties") or {}).items():
        found.extend(_date_fields(child, f"{path}.{name}"))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found.extend(_date_fields(schema[key], f"{path}[*]"))
    return found


def test_every_date_field_of_the_crds_is_checked_by_the_api_server() -> None:
    """A day in a spec carries the calendar rule (the API server refuses 2026-02-30 without the webhook);
    a moment is `format: date-time` (the API server parses it), which only status fields, written by
    the operator and read back by it, have."""
    seen = []
    for crd in (crdgen.nodewright_crd(), crdgen.deploymentpolicy_crd(), crdgen.disruptionbudget_crd()):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, field in _date_fields(schema):
            seen.append(path)
            rules = [r["rule"] for r in field.get("x-kubernetes-validations", [])]
            if "YYYY-MM-DD" in str(field.get("description")):
                assert f"self.matches(r'{CALENDAR_DATE_PATTERN}')" in rules, path
            else:
                assert field.get("format") == "date-time", path
                assert path.startswith(".status."), f"{path}: a moment in a spec needs a rule of its own"
    assert (
        sum(".blackouts[*].start" in p for p in seen) == 3
        and sum(".blackouts[*].end" in p for p in seen) == 3
    )
    # The DisruptionBudget's slot and queue times are read back by every pass of the NodeWrights in its pool.
    assert ".status.slots[*][*]" in seen and ".status.waiting[*]" in seen


def test_windows_reach_the_ends_of_the_calendar() -> None:
    """`end: 9999-12-31` (until further notice) and a start of 0001-01-01 east of UTC used to overflow."""
    now = datetime(2026, 6, 1, tzinfo=UTC)
    forever = Maintenance.model_validate({"blackouts": [{"start": "2026-01-01", "end": "9999-12-31"}]})
    state = windows.evaluate(windows.compile_schedule(forever), now)
    assert not state.active and state.blackout == "2026-01-01..9999-12-31" and state.next_open is None
    for zone in ("Asia/Tokyo", "America/New_York", "Pacific/Kiritimati"):
        ends = Maintenance.model_validate(
            {
                "timeZone": zone,
                "blackouts": [
                    {"start": "0001-01-01", "end": "0001-01-02"},
                    {"start": "9999-12-30", "end": "9999-12-31"},
                ],
            }
        )
        assert windows.evaluate(windows.compile_schedule(ends), now).active


def test_a_day_that_reaches_the_planner_anyway_closes_it_and_says_why() -> None:
    """Only an object built without validation gets here: the blackout then covers every moment."""
    bad = Maintenance.model_construct(
        time_zone="UTC",
        windows=None,
        blackouts=[Blackout.model_construct(start="2026-02-30", end="2026-03-01")],
    )
    schedule = windows.compile_schedule(bad)
    state = windows.evaluate(schedule, datetime(2030, 1, 1, tzinfo=UTC))
    assert not state.active and state.next_open is None
    assert state.error is not None and "blackouts[0]: '2026-02-30' does not exist" in state.error
