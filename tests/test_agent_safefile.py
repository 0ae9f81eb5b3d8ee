"""Reading files someone else hands over: regular files only, bounded size and JSON nesting, and path
lookups that say where they leave their directory (`nodewright.agent.safefile`).

The FIFO test would block forever on a plain `open`; it runs in a thread joined with a timeout as a
safety net, the assertion is on the refusal itself.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.agent import safefile


def _refusal(path: Path, limit: int = 1024) -> str:
    """The refusal of reading `path`, computed in a thread so that a blocking open cannot hang the run."""
    outcome: list[str] = []

    def read() -> None:
        try:
            safefile.read_bytes(str(path), limit=limit)
            outcome.append("read")
        except safefile.Refused as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert outcome, f"reading {path} blocked"
    return outcome[0]


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"x" * 1024)
    assert safefile.read_bytes(str(path), limit=1024) == b"x" * 1024


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert _refusal(fifo) == f"{fifo}: a FIFO, not a regular file; only regular files are read"


def test_a_symlink_to_a_device_is_refused_naming_its_target(tmp_path: Path) -> None:
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    assert _refusal(link) == (
        f"{link}: a symlink to '/dev/zero', a character device, not a regular file; "
        "only regular files are read"
    )


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path) == f"{tmp_path}: a directory, not a regular file; only regular files are read"


def test_a_file_over_the_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * (1024 * 1024 + 1))
    with pytest.raises(safefile.Refused) as caught:
        safefile.read_bytes(str(path), limit=1024 * 1024)
    assert str(caught.value) == f"{path}: larger than the 1 MiB limit for this file (1048577 bytes)"


def test_missing_files_are_oserrors_for_the_caller(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safefile.read_bytes(str(tmp_path / "none"), limit=10)


def test_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1"
    path.write_bytes(b"caf\xe9")
    with pytest.raises(safefile.Refused, match="not UTF-8 text"):
        safefile.read_text(str(path), limit=10)


def test_deep_json_is_refused_before_it_is_decoded() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert safefile.json_too_deep(deep, 64)
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        safefile.loads_json(deep)
    assert safefile.loads_json("[" * 64 + "]" * 64) is not None


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[[[[{{{{", "b": ['"[', "\\[\\", "]]]]"]})
    assert not safefile.json_too_deep(text, 2)
    assert safefile.json_too_deep(text, 1)


@given(
    st.recursive(
        st.none() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_depth_agrees_with_the_structure(value: object) -> None:
    def depth(item: object) -> int:
        if isinstance(item, list):
            return 1 + max((depth(x) for x in item), default=0)
        if isinstance(item, dict):
            return 1 + max((depth(x) for x in item.values()), default=0)
        return 0

    text = json.dumps(value)
    assert not safefile.json_too_deep(text, depth(value))
    assert safefile.json_too_deep(text, depth(value) - 1) == (depth(value) > 0)


# ----------------------------------------------------------------------------------------------------
# Path lookups inside a directory


def test_paths_and_relative_symlinks_inside_resolve(tmp_path: Path) -> None:
    (tmp_path / "skyhook_dir" / "lib").mkdir(parents=True)
    (tmp_path / "skyhook_dir" / "lib" / "real.sh").write_text("#!/bin/sh\n")
    (tmp_path / "skyhook_dir" / "apply.sh").symlink_to("lib/real.sh")
    (tmp_path / "skyhook_dir" / "up.sh").symlink_to("../skyhook_dir/lib/real.sh")
    assert safefile.inside(str(tmp_path), "skyhook_dir/apply.sh") == "skyhook_dir/lib/real.sh"
    assert safefile.inside(str(tmp_path), "skyhook_dir/up.sh") == "skyhook_dir/lib/real.sh"
    assert safefile.inside(str(tmp_path), "skyhook_dir/missing.sh") == "skyhook_dir/missing.sh"


def test_absolute_and_climbing_symlinks_escape(tmp_path: Path) -> None:
    steps = tmp_path / "skyhook_dir"
    steps.mkdir()
    (steps / "abs.sh").symlink_to("/etc/passwd")
    (steps / "climb.sh").symlink_to("../../outside.sh")
    (tmp_path / "linked").symlink_to("/usr")
    (steps / "via.sh").symlink_to("../linked/bin/sh")
    escape = safefile.Escape
    assert safefile.inside(str(tmp_path), "skyhook_dir/abs.sh") == escape("skyhook_dir/abs.sh", "/etc/passwd")
    assert safefile.inside(str(tmp_path), "skyhook_dir/climb.sh") == escape(
        "skyhook_dir/climb.sh", "../../outside.sh"
    )
    assert safefile.inside(str(tmp_path), "skyhook_dir/via.sh") == escape("linked", "/usr")
    assert safefile.inside(str(tmp_path), "../x") == escape(".", "..")


def test_a_symlink_loop_is_an_oserror(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="too many levels of symbolic links"):
        safefile.inside(str(tmp_path), "a")
