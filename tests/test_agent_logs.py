"""Step output: timestamped lines, pieces no longer than the buffer limit, five log files kept per step."""

from __future__ import annotations

import io
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nodewright.agent.logs import LineWriter, LogFiles, Reporter, file_stamp

MOMENT = datetime(2025, 1, 31, 12, 0, 0, 123456, tzinfo=timezone.utc)  # noqa: UP017 - agent style


def _writer(limit: int = 8) -> tuple[LineWriter, io.StringIO, io.StringIO]:
    first, second = io.StringIO(), io.StringIO()
    return LineWriter("out", [first, second], limit=limit, clock=lambda: MOMENT), first, second


def test_lines_are_timestamped_labelled_and_sent_to_every_sink() -> None:
    writer, first, second = _writer(limit=100)
    writer.feed(b"hello\nwor")
    assert first.getvalue() == "2025-01-31T12:00:00.123456+00:00 [out] hello\n"
    writer.feed(b"ld\n")
    writer.feed(b"tail")
    writer.close()
    expected = "".join(f"2025-01-31T12:00:00.123456+00:00 [out] {t}\n" for t in ("hello", "world", "tail"))
    assert first.getvalue() == expected == second.getvalue()


def test_long_lines_are_written_in_pieces_of_the_limit() -> None:
    writer, sink, _ = _writer(limit=4)
    writer.feed(b"abcdefghij")
    assert [line.split("] ", 1)[1] for line in sink.getvalue().splitlines()] == ["abcd", "efgh"]
    writer.feed(b"k\nlmnopqrstu\n")
    writer.close()
    pieces = [line.split("] ", 1)[1] for line in sink.getvalue().splitlines()]
    assert pieces == ["abcd", "efgh", "ijk", "lmno", "pqrs", "tu"]


def test_utf8_split_between_reads_stays_whole_and_bad_bytes_are_replaced() -> None:
    writer, sink, _ = _writer(limit=100)
    data = "héllo ✓\n".encode()
    writer.feed(data[:2])
    writer.feed(data[2:9])
    writer.feed(data[9:] + b"\xff\n")
    writer.close()
    assert [line.split("] ", 1)[1] for line in sink.getvalue().splitlines()] == ["héllo ✓", "\ufffd"]


@given(st.lists(st.binary(max_size=40), max_size=10), st.integers(min_value=1, max_value=16))
def test_pieces_reassemble_the_output_and_respect_the_limit(chunks: list[bytes], limit: int) -> None:
    sink = io.StringIO()
    writer = LineWriter("err", [sink], limit=limit, clock=lambda: MOMENT)
    for chunk in chunks:
        writer.feed(chunk)
    writer.close()
    pieces = [line.split(" [err] ", 1)[1] for line in sink.getvalue().split("\n")[:-1]]
    assert all(len(piece) <= limit for piece in pieces)
    decoded = b"".join(chunks).decode("utf-8", errors="replace")
    assert "".join(pieces) == decoded.replace("\n", "")


def test_reporter_prefixes_every_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    reporter = Reporter(out, err, clock=lambda: MOMENT)
    reporter.info("one\ntwo")
    reporter.warn("careful")
    reporter.error("broken")
    stamp = "2025-01-31T12:00:00.123456+00:00 [agent]"
    assert out.getvalue() == f"{stamp} one\n{stamp} two\n"
    assert err.getvalue() == f"{stamp} WARNING: careful\n{stamp} ERROR: broken\n"


def test_log_names_carry_the_step_path_and_a_sortable_utc_time(tmp_path: Path) -> None:
    files = LogFiles(str(tmp_path), "demo", "1.0.0")
    out, err = files.paths("sub/apply.sh", MOMENT)
    assert out == f"{tmp_path}/demo/1.0.0/sub/apply.sh-2025-01-31-120000.123456.log"
    assert err == out[: -len(".log")] + ".err"
    assert file_stamp(MOMENT) == "2025-01-31-120000.123456"


def test_rotation_keeps_the_newest_five_of_each_kind_per_step(tmp_path: Path) -> None:
    files = LogFiles(str(tmp_path), "demo", "1.0.0")
    directory = tmp_path / "demo" / "1.0.0"
    directory.mkdir(parents=True)
    moments = [MOMENT + timedelta(seconds=i) for i in range(7)]
    for moment in moments:
        for path in files.paths("apply.sh", moment):
            Path(path).write_text("x")
    (directory / "apply.sh-2025-01-31-115959.log").write_text("reference-named, oldest")
    (directory / "apply.sh-extra.sh-2025-01-31-110000.000000.log").write_text("another step")
    (directory / "apply.sh.notes").write_text("not a log")
    files.rotate("apply.sh")
    remaining = sorted(p.name for p in directory.iterdir())
    kept = [file_stamp(m) for m in moments[2:]]
    assert remaining == sorted(
        [f"apply.sh-{s}.log" for s in kept]
        + [f"apply.sh-{s}.err" for s in kept]
        + ["apply.sh-extra.sh-2025-01-31-110000.000000.log", "apply.sh.notes"]
    )
    assert all(re.search(r"\.(log|err)$", n) for n in remaining if n.startswith("apply.sh-2025"))
