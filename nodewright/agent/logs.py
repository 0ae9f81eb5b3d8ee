"""Step output: timestamped lines to the container log and to per-step files on the host.

The container's stdout/stderr is what `kubectl logs` shows while the package pod exists; the operator
deletes finished pods, so each step's output is also kept on the node under
`<root_mount><LOG_DIR>/<pkg>/<ver>/<step path>-<UTC time>.log` (stdout) and `.err` (stderr), the newest
five of each per step (`SKYHOOK_AGENT_WRITE_LOGS=false` turns the files off). Every line is prefixed with
its UTC time and its stream: `2025-01-31T12:00:00.123456+00:00 [out] text`.

Output is read in pieces of at most the buffer limit (`SKYHOOK_AGENT_BUFFER_LIMIT`, 8 KiB) and written
as soon as a line is complete, so a step's progress shows while it runs; a line longer than the limit
is written in pieces of that size rather than held in memory. Decoding is incremental UTF-8 with
replacement, so a character split between two reads stays whole and bad bytes never stop the run.

What a step's output may cost is bounded by the log limit (`NODEWRIGHT_AGENT_LOG_LIMIT`, 2 MiB), per
step and stream, because a chatty step must not fill the node's disk (100 MiB of short lines become
200 MiB with the prefixes) and the end of a failing step's output is what says why it failed:

- the node's log file (`CappedFile`) keeps the *last* `limit` bytes: it is written as lines come, and
  each time it holds twice the limit it is rewritten to its last `limit` bytes (cut at a line start),
  under one marker line saying how many bytes and lines were dropped. So it never exceeds twice the
  limit while the step runs, and holds at most the limit plus the marker once the step has ended;
- the container's stdout/stderr (`CappedEcho`, what `kubectl logs` and the operator's kept log read)
  gets the first half of the limit live, then a marker saying the echo is paused, and when the step
  ends a marker saying what was not echoed followed by the last half of the limit: at most the limit
  plus two marker lines, ending with the step's last line.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import Final, Protocol, TextIO, TypeVar

from nodewright.agent.safefile import size_text

KEEP_LOGS: Final = 5
LOG_LIMIT_VAR: Final = "NODEWRIGHT_AGENT_LOG_LIMIT"
_CHUNK: Final = 64 * 1024
_Self = TypeVar("_Self", bound="_Capped")
_STAMP = re.compile(r"-(\d{4}-\d{2}-\d{2}-\d{6})(?:\.(\d{6}))?\.(log|err)$")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)  # noqa: UP017 - datetime.UTC needs Python 3.11; the agent runs on 3.9


def line_stamp(moment: datetime) -> str:
    """`2025-01-31T12:00:00.123456+00:00`, always with microseconds, so every prefix has one width."""
    return moment.isoformat(timespec="microseconds")


def file_stamp(moment: datetime) -> str:
    """`2025-01-31-120000.123456`: the reference's log-name time with microseconds, which sort by name."""
    return f"{moment.strftime('%Y-%m-%d-%H%M%S')}.{moment.microsecond:06d}"


class Reporter:
    """The agent's own messages, in the same line format as step output."""

    def __init__(self, out: TextIO, err: TextIO, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.out = out
        self.err = err
        self._clock = clock

    def info(self, message: str) -> None:
        self._write(self.out, "agent", message)

    def warn(self, message: str) -> None:
        self._write(self.err, "agent", f"WARNING: {message}")

    def error(self, message: str) -> None:
        self._write(self.err, "agent", f"ERROR: {message}")

    def _write(self, stream: TextIO, label: str, message: str) -> None:
        stamp = line_stamp(self._clock())
        for line in message.splitlines() or [""]:
            stream.write(f"{stamp} [{label}] {line}\n")
        stream.flush()


class Sink(Protocol):
    """Where a step's lines go: the container's stream, a log file, the failure summary."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class LineWriter:
    """Turns a byte stream into timestamped lines written to every sink, in pieces of at most `limit`."""

    def __init__(
        self, label: str, sinks: Sequence[Sink], *, limit: int, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self._label = label
        self._sinks = sinks
        self._limit = limit
        self._clock = clock
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> None:
        self._pending += self._decoder.decode(data)
        *complete, self._pending = self._pending.split("\n")
        pieces = [piece for line in complete for piece in self._split(line)]
        while len(self._pending) >= self._limit:
            pieces.append(self._pending[: self._limit])
            self._pending = self._pending[self._limit :]
        self._emit(pieces)

    def close(self) -> None:
        self._pending += self._decoder.decode(b"", final=True)
        if self._pending:
            self._emit(self._split(self._pending))
        self._pending = ""

    def _split(self, line: str) -> list[str]:
        if len(line) <= self._limit:
            return [line]
        return [line[i : i + self._limit] for i in range(0, len(line), self._limit)]

    def _emit(self, pieces: list[str]) -> None:
        if not pieces:
            return
        stamp = line_stamp(self._clock())
        text = "".join(f"{stamp} [{self._label}] {piece}\n" for piece in pieces)
        for sink in self._sinks:
            sink.write(text)
            sink.flush()


class _Capped(ABC):
    """Shared by the capped sinks: closing, and the marker lines in the agent's own line format."""

    def __init__(self, *, limit: int, stream: str, clock: Callable[[], datetime]) -> None:
        self.limit = limit
        self.stream = stream  # "stdout" or "stderr"
        self._clock = clock

    def _line(self, message: str) -> str:
        return f"{line_stamp(self._clock())} [agent] {message}\n"

    @abstractmethod
    def close(self) -> None:
        """Flush what is held and close the sink (each capped sink knows what it holds)."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class CappedFile(_Capped):
    """A step's log file on the node that keeps the last `limit` bytes written, under a drop marker."""

    def __init__(
        self, path: str, *, limit: int, stream: str, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(limit=limit, stream=stream, clock=clock)
        self.path = path
        self._handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._size = 0  # bytes in the file, marker included
        self._body_start = 0  # where the step's lines start (after the marker)
        self._written = 0  # bytes and lines of the step's output so far
        self._written_lines = 0
        self.dropped = 0
        self.dropped_lines = 0

    def write(self, text: str) -> int:
        data = text.encode("utf-8", errors="replace")
        self._handle.write(data)
        self._size += len(data)
        self._written += len(data)
        self._written_lines += data.count(b"\n")
        if self._size - self._body_start > 2 * self.limit:
            self._compact()
        return len(text)

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        if self._handle.closed:
            return
        try:
            if self._size - self._body_start > self.limit:
                self._compact()
        finally:
            self._handle.close()

    def _compact(self) -> None:
        """Rewrite the file as the marker and its last `limit` bytes, cut at a line start if one is near."""
        self._handle.flush()
        start = self._kept_start()
        kept, kept_lines = self._size - start, 0
        with open(self.path, "rb") as reader:
            reader.seek(start)
            while chunk := reader.read(_CHUNK):
                kept_lines += chunk.count(b"\n")
        self.dropped = self._written - kept
        self.dropped_lines = self._written_lines - kept_lines
        marker = self._line(
            f"{self.stream} log truncated: {self.dropped} bytes ({self.dropped_lines} lines) of this step's "
            f"output dropped before this line; the log keeps the last {size_text(self.limit)} "
            f"({LOG_LIMIT_VAR})"
        ).encode()
        partial = f"{self.path}.partial"
        try:
            with open(self.path, "rb") as reader, open(partial, "wb") as writer:
                writer.write(marker)
                reader.seek(start)
                while chunk := reader.read(_CHUNK):
                    writer.write(chunk)
            os.replace(partial, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        self._handle.close()
        self._handle = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._body_start = len(marker)
        self._size = len(marker) + kept

    def _kept_start(self) -> int:
        """The offset of the first byte kept: `limit` bytes before the end, moved to the next line start."""
        start = self._size - self.limit
        with open(self.path, "rb") as reader:
            reader.seek(start - 1)
            previous = reader.read(1)
            ahead = reader.read(_CHUNK)
        return start + line_start(previous, ahead)


class CappedEcho(_Capped):
    """One stream of a step as the container log gets it: the first half of `limit` live, the last half
    when the step ends, with markers saying what was left out."""

    def __init__(
        self, sink: Sink, *, limit: int, stream: str, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(limit=limit, stream=stream, clock=clock)
        self._sink = sink
        self._head_left = limit // 2
        self._tail_limit = limit - limit // 2
        self._tail: deque[bytes] = deque()  # what was written since the pause, in writes, trimmed
        self._tail_bytes = 0
        self._held = 0  # bytes and lines not echoed live
        self._held_lines = 0
        self._closed = False

    @property
    def paused(self) -> bool:
        return self._held > 0

    def write(self, text: str) -> int:
        if self.paused:
            self._hold(text)
            return len(text)
        lines = _lines(text)
        for index, line in enumerate(lines):
            size = len(line.encode("utf-8", errors="replace"))
            if size > self._head_left:
                self._sink.write(
                    self._line(
                        f"{self.stream} echo paused after {size_text(self.limit // 2)} of this step's output "
                        f"({LOG_LIMIT_VAR}); the last {size_text(self._tail_limit)} follow when the step ends"
                    )
                )
                self._hold("".join(lines[index:]))
                break
            self._sink.write(line)
            self._head_left -= size
        return len(text)

    def _hold(self, text: str) -> None:
        data = text.encode("utf-8", errors="replace")
        self._tail.append(data)
        self._tail_bytes += len(data)
        self._held += len(data)
        self._held_lines += data.count(b"\n")
        while len(self._tail) > 1 and self._tail_bytes - len(self._tail[0]) >= self._tail_limit:
            self._tail_bytes -= len(self._tail.popleft())

    def flush(self) -> None:
        self._sink.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.paused:
            return
        held = b"".join(self._tail)
        start = max(len(held) - self._tail_limit, 0)
        if start > 0:
            start += line_start(held[start - 1 : start], held[start : start + _CHUNK])
        kept = held[start:]
        skipped = self._held - len(kept)
        skipped_lines = self._held_lines - kept.count(b"\n")
        self._sink.write(
            self._line(
                f"{self.stream} echo resumed: {skipped} bytes ({skipped_lines} lines) of this step's output "
                f"were not echoed; its last {len(kept)} bytes follow ({LOG_LIMIT_VAR})"
            )
        )
        self._sink.write(kept.decode("utf-8", errors="replace"))
        self._sink.flush()


def line_start(previous: bytes, ahead: bytes) -> int:
    """How far to move a cut, made after `previous` and before `ahead`, to start a line: 0 at a line
    start, past the next newline if `ahead` has one before its end, else past UTF-8 continuation bytes
    (a line longer than the look-ahead is cut inside, but not inside a character)."""
    if previous in (b"", b"\n"):
        return 0
    newline = ahead.find(b"\n")
    if 0 <= newline < len(ahead) - 1:
        return newline + 1
    skip = 0
    while skip < len(ahead) and ahead[skip] & 0xC0 == 0x80:
        skip += 1
    return skip


def _lines(text: str) -> list[str]:
    """`text` cut after each newline (only "\n": a step's "\r" progress output stays in its line)."""
    parts = text.split("\n")
    last = parts.pop()
    return [f"{part}\n" for part in parts] + ([last] if last else [])


class LogFiles:
    """Per-step log files of one package version under the (real) host log directory."""

    def __init__(self, log_dir: str, package: str, version: str) -> None:
        self.directory = os.path.join(log_dir, package, version)

    def paths(self, step_path: str, moment: datetime) -> tuple[str, str]:
        base = os.path.join(self.directory, f"{step_path}-{file_stamp(moment)}")
        return f"{base}.log", f"{base}.err"

    def rotate(self, step_path: str, *, keep: int = KEEP_LOGS) -> None:
        """Keep the newest `keep` .log and .err files of the step (reference-named files count too)."""
        directory = os.path.dirname(os.path.join(self.directory, step_path))
        prefix = os.path.basename(step_path)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        by_kind: dict[str, list[tuple[str, str]]] = {"log": [], "err": []}
        for name in names:
            match = _STAMP.search(name)
            if match and name[: match.start()] == prefix:
                by_kind[match.group(3)].append((match.group(1) + (match.group(2) or "000000"), name))
        for entries in by_kind.values():
            for _, name in sorted(entries, reverse=True)[keep:]:
                os.unlink(os.path.join(directory, name))
