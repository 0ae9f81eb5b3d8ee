"""Calendar days as the API writes them (`YYYY-MM-DD`, blackout `start`/`end`): which ones exist.

The API server must refuse `2026-02-30` or `2027-02-29` even when the webhook is down, and the operator
must never meet one (it used to fail every reconcile of the NodeWrights using such a policy). The CRD
schema can say it in two ways, and neither is usable as is:

- `format: date` is checked by the API server, but its message ("must be of type date") cannot say what
  to do, and the model could not mirror a check it does not see;
- CEL's `timestamp()` raises on an impossible day instead of answering false, and a rule that raises
  reports the evaluation error, not the rule's message.

So the calendar is spelled out as a regular expression (`CALENDAR_DATE_PATTERN`): years 0001-9999, the
length of every month, February 29 only in leap years (divisible by 4, centuries only when divisible
by 400). It uses only syntax Go's RE2, Rust's regex and Python's `re` read alike, is evaluated by the
API server in a CEL rule (`self.matches(...)`, with a message that says what to write) and, as that
rule's Python predicate, by the models. `date_problem` says the same in words for the webhook ("February
2026 has 28 days"); a property test checks that the two and `datetime.date` agree on every string.
"""

from __future__ import annotations

import calendar
import re
from datetime import date

_YEAR = r"(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
# Divisible by 4 and not a century (the last two digits 04-96 in steps of 4), or a century divisible by
# 400 (the first two digits 04-96 in steps of 4; year 0000 does not exist).
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
CALENDAR_DATE_PATTERN = rf"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)$"
CALENDAR_DATE_MESSAGE = (
    "must be a day of the calendar written YYYY-MM-DD (year 0001-9999), e.g. 2026-02-28: April, June,"
    " September and November have 30 days, February 28 (29 in leap years)"
)
_SHAPE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")


def is_calendar_date(text: str) -> bool:
    """`text` is an existing day written YYYY-MM-DD (what the CRD's CEL rule accepts)."""
    return re.fullmatch(CALENDAR_DATE_PATTERN, text) is not None


def date_problem(text: str) -> str | None:
    """Why `text` is not an existing day written YYYY-MM-DD, in words; None when it is one."""
    shape = _SHAPE.fullmatch(text)
    if shape is None:
        return f"{text[:40]!r} is not a date: write YYYY-MM-DD, e.g. 2026-12-24"
    year, month, day = (int(part) for part in shape.groups())
    if year == 0:
        return f"{text!r}: there is no year 0000; years run from 0001 to 9999"
    if not 1 <= month <= 12:
        return f"{text!r}: there is no month {month:02d}; write YYYY-MM-DD with a month from 01 to 12"
    days = calendar.monthrange(year, month)[1]
    if not 1 <= day <= days:
        leap = " (not a leap year)" if month == 2 and days == 28 else ""
        return (
            f"{text!r} does not exist: {calendar.month_name[month]} {year:04d} has {days} days{leap};"
            f" write a day from {year:04d}-{month:02d}-01 to {year:04d}-{month:02d}-{days:02d}"
        )
    return None


def parse_date(text: str) -> date:
    """The day `text` names; ValueError with `date_problem`'s words when it is none."""
    problem = date_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return date(int(text[:4]), int(text[5:7]), int(text[8:10]))
