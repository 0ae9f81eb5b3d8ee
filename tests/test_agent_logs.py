"""Step output: timestamped lines, pieces no longer than the buffer limit, five log files kept per step."""

from __future__ import annotations

import io
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nodewright.agent.logs import (
    CappedEcho,
    CappedFile,
    LineWriter,
    LogFiles,
    Reporter,
    file_stamp,
)
from nodewright.agent.safefile import size_text

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


# ----------------------------------------------------------------------------------------------------
# What a step's output may cost: the node's file keeps the tail, the container echo head and tail


def _marker(text: str) -> str:
    return text.split(" [agent] ", 1)[1]


@given(
    st.lists(st.text(alphabet="aé✓ \t", max_size=300), max_size=300),
    st.integers(min_value=64, max_value=4096),
)
def test_a_capped_file_keeps_the_last_bytes_at_line_starts_and_counts_the_rest(
    lines: list[str], limit: int
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "step.log"
        written = b""
        with CappedFile(str(path), limit=limit, stream="stdout", clock=lambda: MOMENT) as capped:
            for line in lines:
                capped.write(line + "\n")
                written += (line + "\n").encode()
                assert path.stat().st_size <= 2 * limit + 200 + len(line.encode()) + 1
        data = path.read_bytes()
    if len(written) <= limit:
        assert data == written and capped.dropped == 0
        return
    marker, kept = data.split(b"\n", 1)
    assert len(kept) <= limit and written.endswith(kept)
    assert capped.dropped == len(written) - len(kept)
    assert capped.dropped_lines == written.count(b"\n") - kept.count(b"\n")
    assert _marker(marker.decode()) == (
        f"stdout log truncated: {capped.dropped} bytes ({capped.dropped_lines} lines) of this step's output "
        f"dropped before this line; the log keeps the last {size_text(limit)} (NODEWRIGHT_AGENT_LOG_LIMIT)"
    )
    if any(len((line + "\n").encode()) <= limit // 2 for line in lines[-1:]):
        assert written[: len(written) - len(kept)].endswith(b"\n"), "the kept part starts at a line"


def test_a_line_longer_than_the_limit_is_cut_outside_a_character(tmp_path: Path) -> None:
    path = tmp_path / "step.log"
    with CappedFile(str(path), limit=100, stream="stderr", clock=lambda: MOMENT) as capped:
        capped.write("✓" * 1000 + "é\n")  # 3003 bytes; the last 100 start inside a ✓ (3 bytes each)
    marker, kept = path.read_bytes().split(b"\n", 1)
    assert (
        kept.decode() == "✓" * 32 + "é\n" and "stderr log truncated: 2904 bytes (0 lines)" in marker.decode()
    )
    assert capped.dropped == 2904


@given(
    st.lists(st.text(alphabet="ab✓", max_size=50), max_size=200), st.integers(min_value=16, max_value=2048)
)
def test_the_echo_is_the_head_and_the_tail_within_the_limit(lines: list[str], limit: int) -> None:
    sink = io.StringIO()
    echo = CappedEcho(sink, limit=limit, stream="stdout", clock=lambda: MOMENT)
    for line in lines:
        echo.write(line + "\n")
    echo.close()
    written = [line + "\n" for line in lines]
    echoed = sink.getvalue().splitlines(keepends=True)
    if sum(len(line.encode()) for line in written) <= limit // 2:
        assert echoed == written
        return
    markers = [i for i, line in enumerate(echoed) if " [agent] stdout echo " in line]
    assert len(markers) == 2
    head, tail = echoed[: markers[0]], echoed[markers[1] + 1 :]
    assert head == written[: len(head)]
    assert sum(len(x.encode()) for x in head + tail) <= limit
    assert "".join(written).encode().endswith("".join(tail).encode()), "the tail is the last bytes written"
    skipped = _marker(echoed[markers[1]])
    held = sum(len(x.encode()) for x in written[len(head) :])
    tail_bytes = sum(len(x.encode()) for x in tail)
    assert skipped.startswith(f"stdout echo resumed: {held - tail_bytes} bytes (")


def test_a_quiet_step_is_echoed_unchanged_without_markers() -> None:
    sink = io.StringIO()
    with CappedEcho(sink, limit=1024, stream="stderr", clock=lambda: MOMENT) as echo:
        echo.write("one\ntwo\n")
    assert sink.getvalue() == "one\ntwo\n"


def test_carriage_returns_stay_inside_their_line_in_the_echo_tail() -> None:
    sink = io.StringIO()
    with CappedEcho(sink, limit=16, stream="stdout", clock=lambda: MOMENT) as echo:
        echo.write("x" * 20 + "\n")
        echo.write("10%\r50%\r100%\n")  # one line of progress output: its last 8 bytes are kept
    assert sink.getvalue().endswith("its last 8 bytes follow (NODEWRIGHT_AGENT_LOG_LIMIT)\n0%\r100%\n")
    assert "echo resumed: 26 bytes (1 lines)" in sink.getvalue()
