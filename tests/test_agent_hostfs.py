"""Writing into a host root from outside it: symlinks resolve as inside a chroot, the overlay is faithful."""

from __future__ import annotations

import errno
import inspect
import os
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.agent import hostfs


def test_absolute_symlinks_restart_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "lib").symlink_to("/usr/lib")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "resolv.conf").symlink_to("../run/resolv.conf")
    root = str(tmp_path)
    assert hostfs.in_root(root, "/lib/modules-load.d/x.conf") == f"{root}/usr/lib/modules-load.d/x.conf"
    assert hostfs.in_root(root, "/etc/resolv.conf") == f"{root}/run/resolv.conf"
    assert hostfs.in_root(root, "/etc/resolv.conf", follow_last=False) == f"{root}/etc/resolv.conf"
    assert hostfs.in_root(root, "/../../etc/./x") == f"{root}/etc/x"


def test_symlink_loops_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("/b")
    (tmp_path / "b").symlink_to("/a")
    with pytest.raises(OSError) as caught:
        hostfs.in_root(str(tmp_path), "/a/x")
    assert caught.value.errno == errno.ELOOP


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "..", ".", "up", "abs", "deep"]), max_size=8),
)
def test_resolution_never_leaves_the_root(tmp_path_factory: pytest.TempPathFactory, parts: list[str]) -> None:
    root = tmp_path_factory.mktemp("root")
    (root / "a" / "b").mkdir(parents=True)
    (root / "up").symlink_to("../../../..")
    (root / "abs").symlink_to("/..")
    (root / "a" / "deep").symlink_to("../up/a")
    resolved = hostfs.in_root(str(root), "/" + "/".join(parts))
    assert resolved == str(root) + "/" or resolved.startswith(str(root) + "/")
    assert ".." not in resolved[len(str(root)) :].split("/")


def test_overlay_copies_files_dirs_and_symlinks_onto_the_root(tmp_path: Path) -> None:
    source, root = tmp_path / "root_dir", tmp_path / "host"
    (source / "etc" / "demo").mkdir(parents=True)
    (source / "etc" / "demo" / "tool").write_text("#!/bin/sh\n")
    (source / "etc" / "demo" / "tool").chmod(0o750)
    (source / "etc" / "wants").mkdir()
    (source / "etc" / "wants" / "demo.service").symlink_to("/etc/systemd/system/demo.service")
    (root / "etc").mkdir(parents=True)
    (root / "etc").chmod(0o711)
    written = hostfs.overlay(str(source), str(root))
    assert written == ["/etc/demo/tool", "/etc/wants/demo.service"]
    assert (root / "etc" / "demo" / "tool").read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE((root / "etc" / "demo" / "tool").stat().st_mode) == 0o750
    assert os.readlink(root / "etc" / "wants" / "demo.service") == "/etc/systemd/system/demo.service"
    assert stat.S_IMODE((root / "etc").stat().st_mode) == 0o711, "an existing host directory keeps its mode"


def test_overlay_writes_through_host_symlinks_inside_the_root(tmp_path: Path) -> None:
    source, root = tmp_path / "root_dir", tmp_path / "host"
    (source / "lib" / "modules-load.d").mkdir(parents=True)
    (source / "lib" / "modules-load.d" / "demo.conf").write_text("br_netfilter\n")
    (source / "etc").mkdir()
    (source / "etc" / "localtime").write_text("zone\n")
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "lib").symlink_to("/usr/lib")
    (root / "etc").mkdir()
    (root / "etc" / "localtime").symlink_to("/usr/share/zoneinfo/UTC")
    hostfs.overlay(str(source), str(root))
    assert (root / "usr" / "lib" / "modules-load.d" / "demo.conf").read_text() == "br_netfilter\n"
    assert (root / "usr" / "share" / "zoneinfo" / "UTC").read_text() == "zone\n"
    assert (root / "lib").is_symlink() and (root / "etc" / "localtime").is_symlink()


def test_overlay_replaces_files_but_never_a_directory_with_a_symlink(tmp_path: Path) -> None:
    source, root = tmp_path / "root_dir", tmp_path / "host"
    (source / "etc").mkdir(parents=True)
    (source / "etc" / "old").symlink_to("new")
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "old").write_text("was a file")
    hostfs.overlay(str(source), str(root))
    assert os.readlink(root / "etc" / "old") == "new"
    (root / "etc" / "old").unlink()
    (root / "etc" / "old").mkdir()
    with pytest.raises(OSError, match="root_dir has a symlink where the host has a directory: /etc/old"):
        hostfs.overlay(str(source), str(root))


def test_copy_file_into_root(tmp_path: Path) -> None:
    source = tmp_path / "resolv.conf"
    source.write_text("nameserver 10.0.0.1\n")
    root = tmp_path / "host"
    root.mkdir()
    assert hostfs.copy_file_into_root(str(source), str(root), "/etc/resolv.conf")
    assert (root / "etc" / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"
    assert not hostfs.copy_file_into_root(str(tmp_path / "missing"), str(root), "/etc/resolv.conf")
    assert hostfs.copy_file_into_root(str(source), str(tmp_path), "/resolv.conf"), "same file: no error"


def test_write_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    hostfs.write_atomic(str(target), "one")
    hostfs.write_atomic(str(target), "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.json"]


def test_environment_file(tmp_path: Path) -> None:
    path = tmp_path / "environment"
    path.write_text(
        "PATH=\"/usr/sbin:/usr/bin\"\n# comment\nexport LANG=C.UTF-8\nJUNK LINE\n1BAD=x\nQ='a b'\n"
    )
    assert hostfs.read_environment_file(str(path)) == {
        "PATH": "/usr/sbin:/usr/bin",
        "LANG": "C.UTF-8",
        "Q": "a b",
    }
    assert hostfs.read_environment_file(str(tmp_path / "none")) == {}


def test_overlay_depth_costs_no_recursion(tmp_path: Path) -> None:
    """A package's root_dir/ nested deeper than the interpreter's recursion limit is laid over (os.walk
    recursed per level before Python 3.12: such a tree was a RecursionError traceback on the node)."""
    depth = 300
    target = str(tmp_path / "root_dir")
    os.mkdir(target)
    for _ in range(depth):
        target += "/d"
        os.mkdir(target)
    Path(target, "leaf.conf").write_text("deep\n")
    (tmp_path / "host").mkdir()
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + depth // 2)  # room for the call, not for one frame a level
    try:
        written = hostfs.overlay(str(tmp_path / "root_dir"), str(tmp_path / "host"))
    finally:
        sys.setrecursionlimit(previous)
    assert written == ["/" + "/".join(["d"] * depth) + "/leaf.conf"]
    assert (tmp_path / "host" / ("d/" * depth) / "leaf.conf").read_text() == "deep\n"
