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
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Final, TextIO

KEEP_LOGS: Final = 5
_STAMP = re.compile(r"-(\d{4}-\d{2}-\d{2}-\d{6})(?:\.(\d{6}))?\.(log|err)$")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)  # noqa: UP017 - datetime.UTC needs Python 3.11; the agent runs on 3.9


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
        stamp = self._clock().isoformat()
        for line in message.splitlines() or [""]:
            stream.write(f"{stamp} [{label}] {line}\n")
        stream.flush()


class LineWriter:
    """Turns a byte stream into timestamped lines written to every sink, in pieces of at most `limit`."""

    def __init__(
        self, label: str, sinks: Sequence[TextIO], *, limit: int, clock: Callable[[], datetime] = utc_now
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
        stamp = self._clock().isoformat()
        text = "".join(f"{stamp} [{self._label}] {piece}\n" for piece in pieces)
        for sink in self._sinks:
            sink.write(text)
            sink.flush()


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
