"""The daemonless image build (hack/images/build.py, `make images`): OCI image layouts whose entrypoints
really run inside their unpacked root filesystems.

The build takes Debian's Python from Debian packages (cached base layer) and the project's wheel; each
layout is unpacked layer by layer (digests checked) and its entrypoint run with `--help` under chroot as
the image's user, exactly as a container runtime would start it, minus namespaces. chroot needs root;
without it the tests are skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "hack" / "images" / "build.py"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="chroot into the image's root filesystem needs root"),
    pytest.mark.timeout(900),
]


def build(out: Path, only: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BUILD), "--out", str(out), "--only", only, "--tag", "test"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("images")
    build(out, "operator,webhook,agent")
    yield out


@cache
def image_module() -> Any:
    """hack/images/build.py as a module (its unpack and chroot helpers)."""
    spec = importlib.util.spec_from_file_location("nodewright_image_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def blob(layout: Path, digest: str) -> Any:
    return json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes())


def manifest_and_config(layout: Path) -> tuple[Any, Any]:
    index = json.loads((layout / "index.json").read_text())
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "test"
    manifest = blob(layout, entry["digest"])
    return manifest, blob(layout, manifest["config"]["digest"])


@pytest.mark.parametrize(
    ("image", "args", "user", "says"),
    [
        ("operator", ["operator", "--help"], "10001:10001", "--leader-elect"),
        ("webhook", ["webhook", "--help"], "10001:10001", "--cert-dir"),
        ("agent", ["--help"], "0:0", "usage"),
    ],
)
def test_the_entrypoint_runs_in_the_image(
    layouts: Path, tmp_path: Path, image: str, args: list[str], user: str, says: str
) -> None:
    manifest, config = manifest_and_config(layouts / image)
    assert config["os"] == "linux" and config["config"]["User"] == user
    assert len(manifest["layers"]) == len(config["rootfs"]["diff_ids"]) == 2
    done = image_module().run_in_image(layouts / image, args, work=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert says in done.stdout


def test_operator_and_webhook_share_their_layers_and_differ_in_the_command(layouts: Path) -> None:
    operator_manifest, operator_config = manifest_and_config(layouts / "operator")
    webhook_manifest, webhook_config = manifest_and_config(layouts / "webhook")
    assert operator_manifest["layers"] == webhook_manifest["layers"]
    assert operator_config["config"]["Cmd"] == ["operator"] and webhook_config["config"]["Cmd"] == ["webhook"]
    # The agent image has the same Debian base and nothing of the operator.
    agent_manifest, _ = manifest_and_config(layouts / "agent")
    assert agent_manifest["layers"][0] == operator_manifest["layers"][0]


def test_the_base_has_no_shell_and_no_package_manager(layouts: Path, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    image_module().unpack(layouts / "agent", rootfs)
    for absent in ("bin/sh", "usr/bin/dpkg", "usr/bin/apt-get", "usr/bin/perl"):
        assert not (rootfs / absent).exists(), absent
    assert (rootfs / "usr" / "bin" / "python3.11").exists()
    assert "nodewright:x:10001:10001" in (rootfs / "etc" / "passwd").read_text()


def test_the_sizes_docs_install_md_states_are_the_built_ones(layouts: Path) -> None:
    """docs/install.md's compressed sizes, within 5% of what the build makes (the registry stores and
    nodes pull the compressed layers: the sum of the manifest's layer sizes)."""
    text = " ".join((ROOT / "docs" / "install.md").read_text().split())
    stated = re.search(
        r"compressed sizes (\d+(?:\.\d+)?) MiB \(operator, webhook[^)]*\) and (\d+(?:\.\d+)?) MiB \(agent\)",
        text,
    )
    assert stated is not None, "docs/install.md no longer states the image sizes in the form this test reads"
    for image, figure in (
        ("operator", stated.group(1)),
        ("webhook", stated.group(1)),
        ("agent", stated.group(2)),
    ):
        manifest, _ = manifest_and_config(layouts / image)
        built = sum(int(layer["size"]) for layer in manifest["layers"]) / 2**20
        assert abs(float(figure) - built) <= 0.05 * built, (
            f"docs/install.md says {figure} MiB for {image}, the build makes {built:.1f} MiB:"
            " update the figure"
        )


def test_layers_are_reproducible(layouts: Path, tmp_path: Path) -> None:
    build(tmp_path, "agent")
    first, _ = manifest_and_config(layouts / "agent")
    again, _ = manifest_and_config(tmp_path / "agent")
    assert first == again


def test_the_operator_runs_without_docstrings_from_bytecode_the_image_carries(
    layouts: Path, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    config = image_module().unpack(layouts / "operator", rootfs)["config"]
    assert config["Entrypoint"][1:4] == ["-OO", "-X", "no_debug_ranges"], config["Entrypoint"]
    # The image writes no bytecode (PYTHONDONTWRITEBYTECODE): without these files every start would
    # compile the operator and the standard library again.
    lib = rootfs / "opt" / "nodewright" / "lib"
    for compiled in (
        lib / "nodewright" / "cli" / "__pycache__" / "operator_cmd.cpython-311.opt-2.pyc",
        lib / "aiohttp" / "__pycache__" / "client.cpython-311.opt-2.pyc",
        rootfs / "usr" / "lib" / "python3.11" / "asyncio" / "__pycache__" / "sslproto.cpython-311.opt-2.pyc",
    ):
        assert compiled.is_file(), compiled
        code = marshal.loads(compiled.read_bytes()[16:])  # after the .pyc header
        assert all(column is None for _, _, column, _ in code.co_positions()), f"debug ranges in {compiled}"
    operator_cmd = marshal.loads(
        (lib / "nodewright" / "cli" / "__pycache__" / "operator_cmd.cpython-311.opt-2.pyc").read_bytes()[16:]
    )
    assert not any(isinstance(c, str) and len(c) > 200 for c in operator_cmd.co_consts), "no module docstring"
