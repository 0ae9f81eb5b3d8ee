"""Build the operator, webhook and agent images as OCI image layouts, without a container engine.

    python hack/images/build.py [--out build/images] [--only operator,webhook,agent] [--tag 0.1.0]

Each image is two layers:

1. **base** -- a distroless-style root filesystem from Debian's own packages: Python 3.11
   (`python3.11-minimal`, `libpython3.11-stdlib`) and the libraries they need, found with
   `apt-cache depends --recurse`, downloaded with `apt-get download` and unpacked with `dpkg-deb -x`
   (nothing is installed on this machine, no maintainer script runs). Packages only dpkg and the
   maintainer scripts need (dpkg, perl, tar, mime-support, ...) are left out: no shell, no package
   manager in the image. Plus /etc/passwd and /etc/group with the image user (10001, `nodewright`), /tmp,
   and the standard library compiled to unchecked-hash .pyc files (the root filesystem is read-only at
   run time). Cached under ~/.cache/nodewright/images/base/<digest of the package list>/.
2. **app** -- operator and webhook: the project's wheel and its dependencies (manylinux wheels for
   CPython 3.11, `pip install --target`) under /opt/nodewright/lib; agent: `nodewright/agent` alone under
   /opt/nodewright-agent (standard library only, see images/agent/Dockerfile).

`package-base` is different: one layer with Debian's static busybox (hack/busybox/fetch.sh) as /bin/sh,
mkdir, cp and the other applets, the base a package image needs on a real node (its init container
copies the payload with the image's shell) and one that builds offline:
`nodewright package build DIR --base build/images/package-base -o OUT` (docs/packages.md).

Layers are reproducible: entries sorted, owner root, modification times SOURCE_DATE_EPOCH (default 0),
gzip without a timestamp. The image config carries what the Dockerfiles say: entrypoint, default
command, environment, user (operator/webhook 10001, agent 0). `--check` unpacks each layout and runs the
entrypoint with `--help` inside the root filesystem (chroot; needs root), which is also what
tests/test_images.py does. The last line printed is the output directory.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("NODEWRIGHT_IMAGES_CACHE") or Path.home() / ".cache" / "nodewright" / "images")
PYTHON = "python3.11"
ROOTS = ("python3.11-minimal", "libpython3.11-stdlib")
# Needed only by dpkg and maintainer scripts, never by Python at run time.
LEFT_OUT = re.compile(
    r"^(dpkg|install-info|tar|perl|perl-base|perl-modules-.*|libperl.*|mailcap|mime-support|libgdbm.*"
    r"|libacl1|libselinux1|libpcre2-.*|libmd0|libzstd1|debconf|debianutils|base-files)$"
)
IMAGE_USER = 10001
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
# The operator and webhook run without docstrings (-OO) and without the column ranges of tracebacks
# (-X no_debug_ranges; line numbers stay): 2.8 MiB of an idle operator's memory (docs/install.md
# "Images"). Their layers carry the matching .opt-2.pyc files, compiled the same way, since the image
# writes no bytecode at run time; the standard library in the base layer too. Only these two processes
# read .opt-2.pyc files, so the agent's .pyc files keep their ranges.
NO_DEBUG_RANGES = ("-X", "no_debug_ranges")
OPERATOR_PYTHON_FLAGS = ("-OO", *NO_DEBUG_RANGES)
OPERATOR_PYC_LEVELS = (0, 2)
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
MANYLINUX = [f"manylinux_2_{minor}_{platform.machine()}" for minor in range(36, 16, -1)] + [
    f"manylinux2014_{platform.machine()}"
]


def log(message: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{argv[0]} failed ({done.returncode}): {' '.join(map(str, argv))}\n{done.stderr[-3000:]}"
        )
    return done.stdout


# ----------------------------------------------------------------------------------------------------
# The Debian base


def debian_packages() -> list[tuple[str, str]]:
    """(package, candidate version) of the Python runtime closure, minus what only dpkg needs."""
    out = run(
        "apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
        "--no-breaks", "--no-replaces", "--no-enhances", *ROOTS,
    )  # fmt: skip
    names = sorted({line for line in out.splitlines() if line and not line.startswith((" ", "<"))})
    names = [n for n in names if not LEFT_OUT.match(n)]
    policy = run("apt-cache", "policy", *names)
    versions: dict[str, str] = {}
    current = ""
    for line in policy.splitlines():
        if not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif "Candidate:" in line and current:
            versions[current] = line.split("Candidate:")[1].strip()
    missing = [n for n in names if versions.get(n) in (None, "(none)")]
    if missing:
        raise SystemExit(f"no Debian candidate for {', '.join(missing)}: run 'apt-get update' first")
    return [(n, versions[n]) for n in names]


def ensure_package_lists() -> None:
    out = subprocess.run(["apt-cache", "policy", ROOTS[0]], capture_output=True, text=True, check=False)
    if "Candidate:" in out.stdout and "(none)" not in out.stdout:
        return
    if os.geteuid() != 0:
        raise SystemExit("no Debian package lists: run 'apt-get update' as root")
    log("no package lists yet: apt-get update")
    run("apt-get", "update", "-qq")


def base_layer() -> Layer:
    """The Debian root filesystem layer, from the cache when the package list is unchanged."""
    ensure_package_lists()
    packages = debian_packages()
    key = hashlib.sha256(
        json.dumps([packages, PYTHON, IMAGE_USER, EPOCH, OPERATOR_PYC_LEVELS, NO_DEBUG_RANGES]).encode()
    ).hexdigest()[:16]
    cached = CACHE / "base" / key
    if (cached / "layer.json").exists():
        log(f"base layer cached ({len(packages)} Debian packages): {cached}")
        return Layer.load(cached)
    log(f"base layer: {len(packages)} Debian packages")
    with tempfile.TemporaryDirectory() as tmp:
        debs, rootfs = Path(tmp) / "debs", Path(tmp) / "rootfs"
        debs.mkdir()
        rootfs.mkdir()
        if (
            os.geteuid() == 0
            and shutil.which("id")
            and subprocess.run(["id", "_apt"], capture_output=True).returncode == 0
        ):
            shutil.chown(debs, "_apt")  # apt downloads as its unprivileged user when it can write there
        run("apt-get", "download", *(f"{n}={v}" for n, v in packages), cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            run("dpkg-deb", "--extract", deb, rootfs)
        for doc in (
            "usr/share/doc",
            "usr/share/man",
            "usr/share/lintian",
            "usr/share/locale",
            "usr/share/info",
        ):
            shutil.rmtree(rootfs / doc, ignore_errors=True)
        etc = rootfs / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "passwd").write_text(
            f"root:x:0:0:root:/root:/sbin/nologin\nnodewright:x:{IMAGE_USER}:{IMAGE_USER}:nodewright:/nonexistent:/sbin/nologin\n"
        )
        (etc / "group").write_text(f"root:x:0:\nnodewright:x:{IMAGE_USER}:\n")
        (rootfs / "tmp").mkdir(mode=0o1777, exist_ok=True)
        (rootfs / "root").mkdir(mode=0o700, exist_ok=True)
        compile_tree(rootfs / "usr" / "lib" / PYTHON, strip=rootfs, levels=OPERATOR_PYC_LEVELS)
        (rootfs / "usr" / "share" / "nodewright-image-packages.txt").write_text(
            "".join(f"{n} {v}\n" for n, v in packages)
        )
        layer = Layer.write(rootfs, cached, comment=f"Debian: {', '.join(n for n, _ in packages)}")
    return layer


def compile_tree(tree: Path, *, strip: Path, levels: tuple[int, ...] = (0,)) -> None:
    """Byte-compile `tree` with this interpreter (CPython 3.11: the image's bytecode format) into
    unchecked-hash .pyc files, which stay valid whatever the file times are, one per optimization level
    (2: the `.opt-2.pyc` that `python -OO` reads, compiled as the operator runs: without debug ranges)."""
    if sys.version_info[:2] != (3, 11):
        log(
            f"skipping .pyc files: this is Python {sys.version_info[0]}.{sys.version_info[1]}, the image 3.11"
        )
        return
    for level in levels:
        run(
            sys.executable, *(NO_DEBUG_RANGES if level == 2 else ()), "-m", "compileall", "-q", "-j0",
            "--invalidation-mode", "unchecked-hash", "-o", str(level),
            "-s", strip, "-p", "/", "-x", r"(/test/|/tests/|lib2to3|idlelib|tkinter|turtledemo)", tree,
        )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# Layers and the OCI layout


@dataclass(frozen=True)
class Layer:
    path: Path  # the .tar.gz
    digest: str  # of the compressed blob
    diff_id: str  # of the uncompressed tar
    size: int
    comment: str

    @classmethod
    def load(cls, directory: Path) -> Layer:
        meta = json.loads((directory / "layer.json").read_text())
        return cls(directory / "layer.tar.gz", meta["digest"], meta["diff_id"], meta["size"], meta["comment"])

    @classmethod
    def write(cls, tree: Path, directory: Path, *, comment: str) -> Layer:
        directory.mkdir(parents=True, exist_ok=True)
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted_tree(tree):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = EPOCH
                info.pax_headers = {}
                if info.isfile():
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
        data = raw.getvalue()
        compressed = gzip.compress(data, compresslevel=6, mtime=0)
        target = directory / "layer.tar.gz"
        target.write_bytes(compressed)
        meta: dict[str, Any] = {
            "digest": "sha256:" + hashlib.sha256(compressed).hexdigest(),
            "diff_id": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(compressed),
            "comment": comment,
        }
        (directory / "layer.json").write_text(json.dumps(meta))
        return cls(target, meta["digest"], meta["diff_id"], meta["size"], comment)


def sorted_tree(tree: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        base = Path(dirpath)
        if base != tree:
            yield base
        for name in sorted(filenames):
            yield base / name


@dataclass(frozen=True)
class Image:
    name: str
    entrypoint: list[str]
    cmd: list[str]
    env: list[str]
    user: str
    description: str


def write_layout(out: Path, image: Image, layers: Sequence[Layer], *, tag: str) -> str:
    """An OCI image layout (oci-layout, index.json, blobs/sha256/...); returns the manifest digest."""
    shutil.rmtree(out, ignore_errors=True)
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    for layer in layers:
        shutil.copyfile(layer.path, blobs / layer.digest.removeprefix("sha256:"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))
    labels = {
        "org.opencontainers.image.title": f"nodewright-{image.name}",
        "org.opencontainers.image.description": image.description,
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.source": "https://github.com/nodewright/nodewright",
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    config: dict[str, Any] = {
        "created": created,
        "architecture": ARCH,
        "os": "linux",
        "config": {
            "User": image.user,
            "Env": image.env,
            "Entrypoint": image.entrypoint,
            "Cmd": image.cmd,
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": created, "created_by": "hack/images/build.py", "comment": layer.comment}
            for layer in layers
        ],
    }
    config_digest, config_size = blob(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer.digest,
                "size": layer.size,
            }
            for layer in layers
        ],
        "annotations": labels,
    }
    manifest_digest, manifest_size = blob(
        json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": ARCH, "os": "linux"},
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_text(json.dumps(index, indent=2))
    return manifest_digest


# ----------------------------------------------------------------------------------------------------
# The app layers


def operator_layer(work: Path) -> Layer:
    """The project's wheel and its runtime dependencies under /opt/nodewright/lib."""
    wheels = work / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", wheels, ROOT)
    (wheel,) = wheels.glob("nodewright-*.whl")
    tree = work / "operator-tree"
    lib = tree / "opt" / "nodewright" / "lib"
    platforms = [arg for p in MANYLINUX for arg in ("--platform", p)]
    run(
        sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", lib, "--only-binary=:all:",
        "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311", *platforms, wheel,
    )  # fmt: skip
    shutil.rmtree(lib / "bin", ignore_errors=True)  # console scripts name the build machine's python
    for cache_dir in lib.rglob("__pycache__"):
        shutil.rmtree(cache_dir, ignore_errors=True)
    compile_tree(lib, strip=tree, levels=OPERATOR_PYC_LEVELS)
    return Layer.write(tree, work / "operator-layer", comment=f"{wheel.name} and its dependencies")


def agent_layer(work: Path) -> Layer:
    """nodewright/agent alone: without nodewright/__init__.py the package is a namespace package."""
    tree = work / "agent-tree"
    target = tree / "opt" / "nodewright-agent" / "nodewright" / "agent"
    shutil.copytree(
        ROOT / "nodewright" / "agent", target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    compile_tree(tree / "opt", strip=tree)
    return Layer.write(tree, work / "agent-layer", comment="nodewright/agent")


COMMON_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1",
              "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"]  # fmt: skip
IMAGES = {
    "operator": Image(
        "operator",
        [f"/usr/bin/{PYTHON}", *OPERATOR_PYTHON_FLAGS, "-m", "nodewright"],
        ["operator"],
        [*COMMON_ENV, "PYTHONPATH=/opt/nodewright/lib"],
        f"{IMAGE_USER}:{IMAGE_USER}",
        "NodeWright operator (nodewright operator)",
    ),
    "webhook": Image(
        "webhook",
        [f"/usr/bin/{PYTHON}", *OPERATOR_PYTHON_FLAGS, "-m", "nodewright"],
        ["webhook"],
        [*COMMON_ENV, "PYTHONPATH=/opt/nodewright/lib"],
        f"{IMAGE_USER}:{IMAGE_USER}",
        "NodeWright admission webhook (nodewright webhook)",
    ),
    "agent": Image(
        "agent",
        [f"/usr/bin/{PYTHON}", "-m", "nodewright.agent"],
        ["--help"],
        [*COMMON_ENV, "PYTHONPATH=/opt/nodewright-agent"],
        "0:0",  # every step is chrooted into the host root the package pod mounts
        "NodeWright in-package agent (python -m nodewright.agent)",
    ),
}


PACKAGE_BASE = "package-base"
PACKAGE_BASE_IMAGE = Image(
    PACKAGE_BASE,
    [],
    ["/bin/sh"],
    ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    "0:0",
    "Static busybox: a base for NodeWright package images (nodewright package build --base)",
)


def busybox_layer(work: Path) -> Layer:
    """Debian's static busybox as /bin/busybox with a link per applet (hack/busybox/fetch.sh)."""
    found = run("bash", ROOT / "hack" / "busybox" / "fetch.sh").strip().splitlines()[-1]
    tree = work / "busybox-tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "tmp").mkdir(mode=0o1777)
    shutil.copy2(found, tree / "bin" / "busybox")
    applets = run(str(tree / "bin" / "busybox"), "--list").split()
    for applet in applets:
        if applet != "busybox":
            (tree / "bin" / applet).symlink_to("busybox")
    return Layer.write(
        tree, work / "busybox-layer", comment=f"busybox ({Path(found).parent.name}, Debian's busybox-static)"
    )


# ----------------------------------------------------------------------------------------------------
# Checking a layout


def unpack(layout: Path, into: Path) -> dict[str, Any]:
    """Extract every layer of the layout's image into `into`; returns the image config."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].removeprefix("sha256:")).read_bytes())
    config: dict[str, Any] = json.loads(
        (blobs / manifest["config"]["digest"].removeprefix("sha256:")).read_bytes()
    )
    for layer in manifest["layers"]:
        data = (blobs / layer["digest"].removeprefix("sha256:")).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"], "layer digest mismatch"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(into, filter="fully_trusted")  # our own layers, digests checked
    return config


def run_in_image(layout: Path, args: Sequence[str], *, work: Path) -> subprocess.CompletedProcess[str]:
    """Run the image's entrypoint with `args` inside its unpacked root filesystem (chroot, as root)."""
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    config = unpack(layout, rootfs)["config"]
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    user = config.get("User") or "0:0"
    return subprocess.run(
        ["chroot", f"--userspec={user}", str(rootfs), *config["Entrypoint"], *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def check(out: Path, names: Iterable[str]) -> None:
    for name in names:
        args = ["--help"] if name == "agent" else [name, "--help"]
        with tempfile.TemporaryDirectory() as tmp:
            done = run_in_image(out / name, args, work=Path(tmp))
        if done.returncode != 0 or "usage" not in done.stdout.lower():
            raise SystemExit(
                f"{name}: the entrypoint failed in the image ({done.returncode}):\n{done.stderr}"
            )
        log(f"{name}: `{' '.join(args)}` runs in the image")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "images")
    parser.add_argument(
        "--only", default="operator,webhook,agent,package-base", help="comma-separated images"
    )
    parser.add_argument("--tag", default=None, help="ref name in index.json (default: the project version)")
    parser.add_argument("--check", action="store_true", help="run each entrypoint with --help (chroot, root)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(IMAGES) - {PACKAGE_BASE}
    if unknown:
        parser.error(
            f"unknown image(s) {', '.join(sorted(unknown))}: choose from {', '.join([*IMAGES, PACKAGE_BASE])}"
        )
    tag = args.tag or re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    started = time.monotonic()
    if PACKAGE_BASE in names:
        names.remove(PACKAGE_BASE)
        with tempfile.TemporaryDirectory() as tmp:
            layer = busybox_layer(Path(tmp))
            digest = write_layout(args.out / PACKAGE_BASE, PACKAGE_BASE_IMAGE, [layer], tag=tag)
            log(
                f"{PACKAGE_BASE}: {args.out / PACKAGE_BASE} {digest} ({layer.size / 2**20:.1f} MiB compressed)"
            )
    if not names:
        log(f"done in {time.monotonic() - started:.0f}s")
        print(args.out)
        return 0
    base = base_layer()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        app = operator_layer(work) if {"operator", "webhook"} & set(names) else None
        agent = agent_layer(work) if "agent" in names else None
        for name in names:
            layer = agent if name == "agent" else app
            assert layer is not None
            digest = write_layout(args.out / name, IMAGES[name], [base, layer], tag=tag)
            size = (base.size + layer.size) / 2**20
            log(f"{name}: {args.out / name} {digest} ({size:.1f} MiB compressed)")
    if args.check:
        check(args.out, names)
    log(f"done in {time.monotonic() - started:.0f}s")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
