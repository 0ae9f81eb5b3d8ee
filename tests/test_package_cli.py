"""`nodewright package init|validate|run|build`, through the command line as an author uses it.

init -> validate -> run every mode on a scratch root (and a check failing once its change is undone);
validate reporting every error at once; run's staging and refusals; build's OCI image layout verified
from the bytes (digests, sizes, diff_ids, the layer's entries), reproducibly, on scratch and on a base
layout; and the names a local run uses agreeing with the operator's pod builder.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nodewright.api.models import NodeWright, NodeWrightSpec, ObjectMeta, Package
from nodewright.api.nodestate import PackageStage
from nodewright.cli.main import main
from nodewright.hostroot import boot
from nodewright.packaging import layout, localrun, oci
from nodewright.plan import podspec
from tests.agent_fixtures.hostroot import limit_resources
from tests.packages_node import REPO

JSON = dict[str, Any]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["package", *argv])
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def package(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    target = tmp_path / "gpu-probe"
    code, out, _ = _cli(capsys, "init", "gpu-probe", "--dir", str(target))
    assert code == 0 and f"created package gpu-probe 0.1.0 in {target}" in out
    return target


# ----------------------------------------------------------------------------------------------------
# init, validate, run


def test_init_validate_and_run_every_mode(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "validate", str(package))
    assert code == 0 and out.endswith("gpu-probe 0.1.0 is valid (0 warnings)\n")
    root = tmp_path / "node"
    setting = tmp_path / "example.conf"
    setting.write_text("level=3\n")
    config = ["--config", f"example.conf={setting}"]

    def run(mode: str, *extra: str) -> tuple[int, str]:
        code, out, err = _cli(capsys, "run", mode, str(package), "--root", str(root), *extra)
        return code, out + err

    for mode in ("apply", "apply-check", "config", "config-check"):
        code, text = run(mode, *config)
        assert code == 0, text
        assert f"{mode} of gpu-probe 0.1.0 succeeded (agent exit 0)" in text
        assert "no chroot (unprivileged mode)" in text
    # The scaffold's interrupt is a reboot: its post-interrupt check reads the boot id back, and fails
    # until the node has rebooted since the install.
    code, text = run("post-interrupt-check", *config)
    assert code == 1 and "the node has not rebooted since gpu-probe was installed" in text, text
    code, text = run("interrupt", "--interrupt", "reboot")
    assert code == 0 and "reboot: the root booted (boot id" in text, text
    booted = (root / "proc/sys/kernel/random/boot_id").read_text().strip()
    for mode in ("post-interrupt", "post-interrupt-check"):
        code, text = run(mode, *config)
        assert code == 0, text
        assert f"{mode} of gpu-probe 0.1.0 succeeded (agent exit 0)" in text
    assert f"post-interrupt ran after the reboot, in boot {booted}" in text
    # A later reboot (what a drift check finds on a node rebooted since) still passes the check.
    assert run("interrupt", "--interrupt", "reboot")[0] == 0
    assert (root / "proc/sys/kernel/random/boot_id").read_text().strip() != booted
    assert run("post-interrupt-check")[0] == 0
    assert (root / "etc/gpu-probe/conf.d/example.conf").read_text() == "level=3\n"
    assert (root / "etc/gpu-probe/defaults.conf").is_file(), "root_dir/ was laid over the root"
    state = root / "var/lib/skyhook/local"
    history = json.loads((state / "history/gpu-probe.json").read_text())
    assert history["current-version"] == "0.1.0", "flags and history where the operator's agent keeps them"
    assert list((root / "var/log/skyhook/local/gpu-probe/0.1.0").glob("config.sh-*.log"))

    setting.write_text("level=4\n")  # the configMap changed, config has not run yet
    code, text = run("config-check", *config)
    assert (
        code == 1 and "differs from the configMap's example.conf" in text and "FAILED (agent exit 1)" in text
    )
    run("config", *config)
    assert run("config-check", *config)[0] == 0

    (root / "var/lib/gpu-probe/installed").unlink()  # undone behind the package's back
    code, text = run("apply-check")
    assert code == 1 and "gpu-probe is not installed" in text

    assert run("uninstall")[0] == 0
    assert not (root / "etc/gpu-probe").exists() and not (root / "var/lib/gpu-probe").exists()
    assert run("uninstall-check")[0] == 0
    assert json.loads((state / "history/gpu-probe.json").read_text())["current-version"] == "uninstalled"


def test_init_refuses_bad_names_and_used_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "init", "GPU_probe", "--dir", str(tmp_path / "x"))
    assert code == 2 and "package name 'GPU_probe' must be lowercase letters" in err
    assert not (tmp_path / "x").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine\n")
    code, _, err = _cli(capsys, "init", "probe", "--dir", str(tmp_path / "used"))
    assert code == 2 and "already exists and is not an empty directory" in err
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["notes.txt"]


def _broken_package(directory: Path) -> None:
    steps = directory / "skyhook_dir"
    steps.mkdir(parents=True)

    def step(path: str) -> JSON:
        return {"name": path.split(".")[0], "path": path, "arguments": [], "returncodes": [0],
                "on_host": True, "idempotence": False, "upgrade_step": False}  # fmt: skip

    config = {
        "schema_version": "v1",
        "package_name": "Broken_Pkg",
        "package_version": "1.0",
        "expected_config_files": ["conf/settings.ini"],
        "modes": {
            "apply": [step("apply.sh"), step("gone.sh")],
            "apply-check": [step("apply_check.sh")],
            "config": [step("config.sh")],
            "config-check": [step("config_check.sh")],
            "uninstall": [step("uninstall.sh")],
            "uninstall-check": [step("uninstall_check.sh")],
        },
    }
    (directory / "config.json").write_text(json.dumps(config))
    scripts = {
        "apply.sh": "#!/bin/sh\necho ok\n",
        "apply_check.sh": "echo no shebang\n",
        "config.sh": "#!/bin/sh\r\necho crlf\r\n",
        "config_check.sh": "#!/bin/sh\nif true; then\necho unterminated\n",
        "uninstall.sh": "#!/bin/sh\nrm -rf /x\n",
        "uninstall_check.sh": "#!/bin/sh\ntrue\n",
    }
    for name, body in scripts.items():
        (steps / name).write_text(body)
        (steps / name).chmod(0o755)
    (steps / "uninstall.sh").chmod(0o644)
    (directory / "Dockerfile").write_text("FROM busybox:1.36.1 AS build\nFROM scratch\nCOPY . /payload/\n")
    (directory / "configmaps").mkdir()


def test_validate_reports_every_problem_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    _broken_package(broken)
    code, out, err = _cli(capsys, "validate", str(broken))
    assert code == 1 and out == ""
    expected = [
        "error: config.json: package_version: '1.0' is not a full semantic version",
        "error: config.json: modes.apply[1].path: 'gone.sh' not found in",
        "error: config.json: expected_config_files[0]: key 'conf/settings.ini' must be letters, digits",
        "error: skyhook_dir/apply_check.sh (modes.apply-check[0]): does not start with '#!'",
        "error: skyhook_dir/config.sh (modes.config[0]): has Windows (CRLF) line endings",
        "error: skyhook_dir/config_check.sh (modes.config-check[0]): sh -n finds a syntax error",
        "error: skyhook_dir/uninstall.sh (modes.uninstall[0]): not executable; run chmod +x",
        "error: Dockerfile: the image is FROM scratch, but the package pod's init container runs /bin/sh",
        "error: Dockerfile: never mentions /skyhook-package",
        "warning: config.json: package_name 'Broken_Pkg' cannot be a NodeWright spec.packages key",
        "warning: README.md: missing",
        "warning: configmaps/: part of the image, but hidden entirely",
        f"{broken}: 9 errors; package is not usable",
    ]
    lines = err.splitlines()
    for prefix in expected:
        assert any(line.startswith(prefix) for line in lines), f"missing {prefix!r} in:\n{err}"


def test_validate_of_a_directory_without_a_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "validate", str(tmp_path))
    assert code == 1
    assert "error: config.json: file not found: a package needs config.json at its top" in err
    assert "error: Dockerfile: missing" in err
    code, _, err = _cli(capsys, "validate", str(tmp_path / "nothing"))
    assert code == 1 and "not a directory" in err


@pytest.mark.parametrize("name", ["shell", "tuning", "kdump", "bind-mount", "eks-node-init"])
def test_the_reference_packages_validate_cleanly(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    version = json.loads((REPO / "packages" / name / "config.json").read_text())["package_version"]
    code, out, err = _cli(capsys, "validate", str(REPO / "packages" / name))
    assert (code, err) == (0, "") and out.endswith(f"{name} {version} is valid (0 warnings)\n")


def test_every_package_of_the_catalogue_is_validated() -> None:
    listed = {p.parent.name for p in (REPO / "packages").glob("*/config.json")}
    assert listed == {"shell", "tuning", "kdump", "bind-mount", "eks-node-init"}


def test_run_refuses_bad_requests_with_every_reason(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(
        capsys, "run", "aply", str(package), "--root", "/", "--config", "bad/key=/nonexistent",
        "--env", "SKYHOOK_ROOT_DIR=/x", "--env", "1X=y",
    )  # fmt: skip
    assert code == 2
    for reason in (
        "mode 'aply' is not an agent mode; use one of: apply, config",
        "--root / is this machine's /",
        "--config bad/key=/nonexistent: key 'bad/key' must be letters",
        "--config bad/key=/nonexistent: no such file",
        "--env SKYHOOK_ROOT_DIR: set by the operator on every package pod",
        "--env 1X: environment variable name '1X' must be",
    ):
        assert reason in err, err
    code, _, err = _cli(capsys, "run", "interrupt", str(package), "--root", str(tmp_path / "r"))
    assert code == 2 and "the interrupt mode needs --interrupt TYPE" in err
    code, _, err = _cli(
        capsys, "run", "interrupt", str(package), "--root", str(tmp_path / "r"), "--interrupt", "service"
    )
    assert code == 2 and "--interrupt service needs at least one --service UNIT" in err
    problems = localrun.check_request(
        localrun.RunRequest(mode="apply", package_dir=package, root=tmp_path / "r", chroot=True),
        is_root=False,
    )
    assert problems == ["--chroot needs root (chroot is a privileged call); leave it out to run unprivileged"]


def test_run_interrupt_records_the_commands_instead_of_running_them(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "node"
    code, out, _ = _cli(
        capsys, "run", "interrupt", str(package), "--root", str(root), "--interrupt", "service",
        "--service", "containerd.service", "--service", "kubelet.service",
    )  # fmt: skip
    assert code == 0 and "interrupt commands recorded, not run on this machine" in out
    recorded = [
        json.loads(line) for line in (root / "var/lib/skyhook/local/interrupts/requested.jsonl").open()
    ]
    assert [entry["command"] for entry in recorded] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "restart", "containerd.service"],
        ["systemctl", "restart", "kubelet.service"],
    ]
    [resource_id] = {entry["resource_id"] for entry in recorded}
    assert re.fullmatch(r"local-local-1-\d{8}T\d{12}Z\.1_gpu-probe_0\.1\.0", resource_id), resource_id


def test_run_interrupt_plays_the_nodes_part_on_the_root_as_the_simulator_does(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "node"
    (root / "etc/sysctl.d").mkdir(parents=True)
    (root / "etc/sysctl.d/90-probe.conf").write_text(
        "vm.swappiness = 10\nnet.ipv4.tcp_rmem = 4096 131072 6291456\n"
    )
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/grub").write_text(
        'GRUB_CMDLINE_LINUX="iommu=pt"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    )
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/overcommit_memory").write_text("1\n")  # set at run time only: gone after a boot

    def interrupt(*how: str) -> str:
        code, out, err = _cli(capsys, "run", "interrupt", str(package), "--root", str(root), *how)
        assert code == 0, out + err
        return out

    out = interrupt("--interrupt", "service", "--service", "containerd.service")
    assert "systemctl restart containerd.service: done by the node's systemctl stand-in (exit 0)" in out
    assert not (root / "proc/sys/vm/swappiness").exists(), "a service restart does not reload sysctls"
    commands = (root / "var/log/nodewright-sim/commands.log").read_text()
    assert "systemctl daemon-reload" in commands and "systemctl restart containerd.service" in commands

    out = interrupt("--interrupt", "restartAllServices")
    assert "service procps force-reload: done by the node's service stand-in" in out
    assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"

    out = interrupt("--interrupt", "reboot")
    assert "reboot: the root booted" in out, out
    assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (root / "proc/sys/net/ipv4/tcp_rmem").read_text() == "4096\t131072\t6291456\n", "procfs' tabs"
    assert not (root / "proc/sys/vm/overcommit_memory").exists(), "a runtime-only value does not survive"
    assert (root / "proc/cmdline").read_text() == "root=/dev/sda1 ro iommu=pt quiet\n"
    assert f"boot id {boot.recorded_boot_id(root)}," in out

    # The same boot as the simulator's nodes: one rule, one place.
    simulated = tmp_path / "simulated"
    shutil.copytree(root / "etc", simulated / "etc")
    boot.boot(simulated, boot.BootFacts(boot_id="b"))
    for path in ("proc/sys/vm/swappiness", "proc/sys/net/ipv4/tcp_rmem", "proc/cmdline", "proc/1/mountinfo"):
        assert (simulated / path).read_text() == (root / path).read_text(), path

    # noop runs nothing on the node.
    before = boot.recorded_boot_id(root)
    interrupt("--interrupt", "noop")
    assert boot.recorded_boot_id(root) == before


def test_staging_copies_the_payload_as_the_package_pod_does(package: Path, tmp_path: Path) -> None:
    root = tmp_path / "node"
    (package / ".git").mkdir()
    (package / ".git" / "HEAD").write_text("ref\n")
    (package / "skyhook_dir" / "__pycache__").mkdir()
    (package / "root_dir" / "etc" / "localtime").symlink_to("/usr/share/zoneinfo/UTC")
    (package / "configmaps").mkdir()
    (package / "configmaps" / "baked.conf").write_text("from the image\n")
    copy_dir = layout.Identity().copy_dir("gpu-probe", "0.1.0")
    target = localrun.stage(package, root, copy_dir)
    assert (target / "configmaps" / "baked.conf").is_file(), "without --config the image's configmaps/ stays"
    assert not (target / ".git").exists() and not (target / "skyhook_dir" / "__pycache__").exists()
    assert os.readlink(target / "root_dir" / "etc" / "localtime") == "/usr/share/zoneinfo/UTC"
    assert os.access(target / "skyhook_dir" / "apply.sh", os.X_OK)

    given = tmp_path / "given.conf"
    given.write_text("from the configMap\n")
    (package / "skyhook_dir" / "post_interrupt.sh").unlink()
    target = localrun.stage(package, root, copy_dir, {"example.conf": given})
    assert sorted(p.name for p in (target / "configmaps").iterdir()) == ["example.conf"], "a mount hides it"
    assert not (target / "skyhook_dir" / "post_interrupt.sh").exists(), "a fresh copy every run"

    (root / "var" / "lib" / "skyhook" / "local").rename(tmp_path / "moved")
    (root / "var" / "lib" / "skyhook" / "local").symlink_to(tmp_path / "moved")
    with pytest.raises(localrun.RunRequestError, match="is a symlink"):
        localrun.stage(package, root, copy_dir)


def test_a_local_run_uses_the_operators_names() -> None:
    from nodewright.api.models import PACKAGE_NAME_PATTERN, NodeWright
    from nodewright.plan import podspec

    assert layout.PACKAGE_NAME.pattern == PACKAGE_NAME_PATTERN
    options = podspec.PodOptions()
    ours = (layout.COPY_DIR_ROOT, layout.LOG_ROOT, layout.PAYLOAD_DIR)
    assert ours == (options.copy_dir_root, options.log_root, podspec.PAYLOAD_DIR)
    nw = NodeWright.model_validate(
        {"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
         "metadata": {"name": "local", "uid": "local", "generation": 1},
         "spec": {"packages": {"demo": {"version": "1.0.0", "image": "registry.example.com/demo"}}}}
    )  # fmt: skip
    identity = layout.Identity()
    assert identity.copy_dir("demo", "1.0.0") == podspec.copy_dir(nw, "demo", "1.0.0", options)
    assert identity.resource_id("demo", "1.0.0") == podspec.resource_id(nw, "demo", "1.0.0")
    run = podspec.interrupt_run("2025-01-31T12:00:00Z", 2)
    assert identity.resource_id("demo", "1.0.0", run) == podspec.resource_id(nw, "demo", "1.0.0", run)
    operator_env = {e["name"]: e["value"] for e in podspec._agent_env(nw, "demo", "1.0.0", 0, options)}
    request = localrun.RunRequest(mode="apply", package_dir=Path("."), root=Path("/tmp/x"))
    local_env = localrun.agent_environment(request, "demo", "1.0.0", machine={})
    assert {k: local_env[k] for k in operator_env} == operator_env
    assert podspec._RESERVED_ENV <= localrun.OPERATOR_ENV, "--env refuses what a package's env cannot set"
    assert set(operator_env) - {"COPY_RESOLV"} <= localrun.OPERATOR_ENV


def test_the_package_command_loads_no_client_stack() -> None:
    code = (
        "import sys, nodewright.cli.package_cmd, nodewright.packaging.localrun, nodewright.packaging.oci, "
        "nodewright.packaging.validate, nodewright.packaging.scaffold\n"
        "print(sorted(m for m in ('pydantic', 'aiohttp', 'kubernetes_asyncio', 'structlog', 'opentelemetry') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------------------
# build


def _blob(layout_dir: Path, descriptor: JSON) -> bytes:
    algorithm, _, digest = str(descriptor["digest"]).partition(":")
    data = (layout_dir / "blobs" / algorithm / digest).read_bytes()
    assert algorithm == "sha256" and hashlib.sha256(data).hexdigest() == digest, (
        "blob content matches its name"
    )
    assert len(data) == descriptor["size"], "descriptor size matches the blob"
    return data


def _image(layout_dir: Path) -> tuple[JSON, JSON, JSON, JSON]:
    """(index entry, manifest, config, index) of a single-image OCI layout, every digest checked."""
    assert json.loads((layout_dir / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout_dir / "index.json").read_text())
    assert index["schemaVersion"] == 2 and index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [entry] = index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    manifest = json.loads(_blob(layout_dir, entry))
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == entry["mediaType"]
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config = json.loads(_blob(layout_dir, manifest["config"]))
    diff_ids = []
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        diff_ids.append("sha256:" + hashlib.sha256(gzip.decompress(_blob(layout_dir, layer))).hexdigest())
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}, (
        "diff_ids are the uncompressed layers"
    )
    return entry, manifest, config, index


def _members(layout_dir: Path, layer: JSON) -> dict[str, tarfile.TarInfo]:
    data = gzip.decompress(_blob(layout_dir, layer))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {member.name: member for member in tar.getmembers()}


def test_build_on_scratch_writes_a_verifiable_oci_layout(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (package / "root_dir" / "etc" / "localtime").symlink_to("/usr/share/zoneinfo/UTC")
    (package / ".gitignore").write_text("*.tmp\n")
    out = tmp_path / "image"
    code, stdout, stderr = _cli(capsys, "build", str(package), "--base", "scratch", "-o", str(out))
    assert code == 0, stderr
    assert "warning: base scratch: the image holds only the payload" in stderr
    assert f"push: skopeo copy oci:{out}:0.1.0 docker://" in stdout
    entry, manifest, config, _ = _image(out)
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "0.1.0"}
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Labels"]["org.opencontainers.image.title"] == "gpu-probe"
    assert manifest["annotations"]["org.opencontainers.image.version"] == "0.1.0"
    assert len(config["history"]) == 1 and config["created"] == "1970-01-01T00:00:00Z"
    members = _members(out, manifest["layers"][0])
    assert list(members)[:4] == ["skyhook-package", "skyhook-package/Dockerfile", "skyhook-package/README.md",
                                 "skyhook-package/config.json"]  # fmt: skip
    assert "skyhook-package/.gitignore" not in members
    script = members["skyhook-package/skyhook_dir/apply.sh"]
    assert (script.mode, script.uid, script.gid, script.uname, script.mtime) == (0o755, 0, 0, "", 0)
    assert members["skyhook-package/config.json"].mode == 0o644
    assert members["skyhook-package/root_dir/etc/localtime"].linkname == "/usr/share/zoneinfo/UTC"
    data = gzip.decompress(_blob(out, manifest["layers"][0]))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        extracted = tar.extractfile("skyhook-package/config.json")
        assert extracted is not None
        assert extracted.read() == (package / "config.json").read_bytes()


@pytest.fixture(scope="module")
def package_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The busybox base `make images` writes (build/images/package-base), built here as it does."""
    out = tmp_path_factory.mktemp("images")
    result = subprocess.run(
        [sys.executable, str(REPO / "hack/images/build.py"), "--only", "package-base", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"hack/images/build.py --only package-base failed:\n{result.stderr}"
    return out / "package-base"


def _image_build_module() -> Any:
    spec = importlib.util.spec_from_file_location("nodewright_image_build", REPO / "hack/images/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_offline_route_init_validate_build_on_the_package_base(
    package_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/packages.md's route with no registry and no Docker: init, validate, build onto the busybox
    base of `make images`; the image then does what a package pod's copy step does on a real node."""
    package = tmp_path / "first-package"
    assert _cli(capsys, "init", "first-package", "--dir", str(package))[0] == 0
    code, out, _ = _cli(capsys, "validate", str(package))
    assert code == 0 and out.endswith("first-package 0.1.0 is valid (0 warnings)\n"), out
    image = tmp_path / "images" / "first-package"
    image.parent.mkdir()
    code, out, err = _cli(capsys, "build", str(package), "--base", str(package_base), "-o", str(image))
    assert code == 0 and "warning" not in (out + err).lower(), out + err
    base = oci.open_layout(package_base, where="package-base")
    built = oci.open_layout(image, ref="0.1.0", where="the package image")
    assert built.layers[:-1] == base.layers, "the base's busybox layer, then the payload"
    assert built.config["config"]["Cmd"] == ["/bin/sh"], "the base's config is kept"
    route = (
        "nodewright package build . --base <checkout>/build/images/package-base -o /tmp/images/first-package"
    )
    assert route in (package / "README.md").read_text(), "the scaffold's README gives this route"
    assert "build/images/package-base" in (package / "Dockerfile").read_text()
    if os.geteuid() != 0:
        pytest.skip("running the image's copy step chrooted into its root filesystem needs root")
    # The package pod's init container, as the operator builds it, run in the image's root file system.
    rootfs = tmp_path / "rootfs"
    _image_build_module().unpack(image, rootfs)
    package_spec = Package(version="0.1.0", image="registry.example.com/packages/first-package")
    nw = NodeWright(
        metadata=ObjectMeta(name="first", uid="uid-1", generation=1),
        spec=NodeWrightSpec(packages={"first-package": package_spec}),
    )
    options = podspec.PodOptions()
    pod = podspec.build_pod(
        nw, package_spec, package_name="first-package", version="0.1.0", stage=PackageStage.APPLY,
        node="n1", attempt=1, node_order=0, options=options,
    )  # fmt: skip
    [copy] = [c for c in pod["spec"]["initContainers"] if c["name"] == "first-package-init"]
    env = {"PATH": "/bin", **{e["name"]: e["value"] for e in copy["env"]}}
    (rootfs / options.host_root_mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), *copy["command"], *copy["args"]],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    copied = rootfs / options.host_root_mount.lstrip("/") / env["SKYHOOK_DIR"].lstrip("/")
    assert (copied / "config.json").read_bytes() == (package / "config.json").read_bytes()
    assert os.access(copied / "skyhook_dir/post_interrupt_check.sh", os.X_OK)


def test_build_is_reproducible(package: Path, tmp_path: Path) -> None:
    first = oci.build(package, base="scratch", output=tmp_path / "one")
    os.utime(package / "config.json", (1_000_000, 1_000_000))
    (package / "skyhook_dir" / "apply.sh").chmod(0o775)  # group bits are not carried
    second = oci.build(package, base="scratch", output=tmp_path / "two")
    assert first.manifest_digest == second.manifest_digest and first.layer_digest == second.layer_digest
    third = oci.build(package, base="scratch", output=tmp_path / "three", epoch=1_700_000_000)
    assert third.manifest_digest != first.manifest_digest
    assert _image(tmp_path / "three")[2]["created"] == "2023-11-14T22:13:20Z"


def _base_layout(
    directory: Path, *, docker_types: bool = False, platforms: tuple[str, ...] = ("amd64",)
) -> str:
    """A small base image layout: one layer with bin/sh per platform, Docker or OCI media types."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> JSON:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifests = []
    for arch in platforms:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo("bin/sh")
            body = f"#!shell for {arch}\n".encode()
            info.size, info.mode = len(body), 0o755
            tar.addfile(info, io.BytesIO(body))
        layer_bytes = gzip.compress(raw.getvalue(), mtime=0)
        layer = put(layer_bytes) | {
            "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip"
            if docker_types
            else "application/vnd.oci.image.layer.v1.tar+gzip"
        }
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"], "Labels": {"base": "yes"}},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()],
            },
            "history": [{"created_by": "base layer"}],
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json"
            if docker_types
            else "application/vnd.oci.image.manifest.v1+json",
            "config": put(json.dumps(config).encode())
            | {"mediaType": "application/vnd.oci.image.config.v1+json"},
            "layers": [layer],
        }
        manifests.append(
            put(json.dumps(manifest).encode())
            | {"mediaType": manifest["mediaType"], "platform": {"architecture": arch, "os": "linux"}}
        )
    if len(manifests) > 1:
        nested = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        }
        manifests = [put(json.dumps(nested).encode()) | {"mediaType": nested["mediaType"]}]
    manifests[0]["annotations"] = {"org.opencontainers.image.ref.name": "1.36.1"}
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return f"{directory}:1.36.1"


@pytest.mark.parametrize("docker_types", [False, True])
def test_build_on_a_base_layout_adds_one_layer(package: Path, tmp_path: Path, docker_types: bool) -> None:
    base = _base_layout(tmp_path / "busybox", docker_types=docker_types)
    result = oci.build(package, base=base, output=tmp_path / "image", tag="0.1.0-dev")
    entry, manifest, config, _ = _image(tmp_path / "image")
    assert result.warnings == () and entry["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0-dev"
    base_layer, payload_layer = manifest["layers"]
    assert "bin/sh" in _members(tmp_path / "image", base_layer), "the base's layer is carried"
    assert "skyhook-package/config.json" in _members(tmp_path / "image", payload_layer)
    assert config["config"]["Env"] == ["PATH=/bin"] and config["config"]["Labels"]["base"] == "yes"
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == "0.1.0"
    assert [h["created_by"] for h in config["history"]][:1] == ["base layer"] and len(config["history"]) == 2
    assert manifest["annotations"]["org.opencontainers.image.base.digest"].startswith("sha256:")


def test_build_picks_the_platform_of_a_multi_platform_base(package: Path, tmp_path: Path) -> None:
    base = _base_layout(tmp_path / "multi", platforms=("amd64", "arm64"))
    result = oci.build(package, base=base, output=tmp_path / "arm", platform="linux/arm64")
    entry, manifest, config, _ = _image(tmp_path / "arm")
    assert entry["platform"] == {"architecture": "arm64", "os": "linux"} and config["architecture"] == "arm64"
    member = _members(tmp_path / "arm", manifest["layers"][0])["bin/sh"]
    assert member.size == len(b"#!shell for arm64\n") and str(result.platform) == "linux/arm64"
    with pytest.raises(oci.BuildError, match="several images"):
        oci.build(package, base=base, output=tmp_path / "riscv", platform="linux/riscv64")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda base: (base / "oci-layout").unlink(), "is not an OCI image layout"),
        (
            lambda base: next((base / "blobs" / "sha256").iterdir()).write_bytes(b"garbage"),
            "the layout is corrupt",
        ),
    ],
)
def test_build_refuses_a_broken_base(package: Path, tmp_path: Path, change: object, message: str) -> None:
    base = _base_layout(tmp_path / "base")
    assert callable(change)
    change(tmp_path / "base")
    with pytest.raises(oci.BuildError, match=message):
        oci.build(package, base=base, output=tmp_path / "image")
    assert not (tmp_path / "image").exists(), "nothing is left behind"


def test_build_refusals(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _base_layout(tmp_path / "base")
    with pytest.raises(oci.BuildError, match="no image named 'latest'"):
        oci.build(package, base=f"{tmp_path / 'base'}:latest", output=tmp_path / "x")
    with pytest.raises(oci.BuildError, match="is linux/amd64, not linux/arm64"):
        oci.build(package, base=base, output=tmp_path / "x", platform="linux/arm64")
    with pytest.raises(oci.BuildError, match="inside the package directory"):
        oci.build(package, base="scratch", output=package / "image")
    with pytest.raises(oci.BuildError, match=r"tag '1\.0\.0\+build' is not a valid image tag"):
        oci.build(package, base="scratch", output=tmp_path / "x", tag="1.0.0+build")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep\n")
    code, _, err = _cli(
        capsys, "build", str(package), "--base", "scratch", "-o", str(tmp_path / "notes"), "--force"
    )
    assert (
        code == 1 and "--force replaces only an OCI layout" in err and (tmp_path / "notes" / "a.txt").exists()
    )
    oci.build(package, base="scratch", output=tmp_path / "image")
    code, _, err = _cli(capsys, "build", str(package), "--base", "scratch", "-o", str(tmp_path / "image"))
    assert code == 1 and "exists and is not empty; pass --force" in err
    assert (
        _cli(capsys, "build", str(package), "--base", "scratch", "-o", str(tmp_path / "image"), "--force")[0]
        == 0
    )
    (package / "config.json").write_text("{}")
    code, _, err = _cli(capsys, "build", str(package), "--base", "scratch", "-o", str(tmp_path / "y"))
    assert code == 1 and "schema_version: required field missing" in err


# ----------------------------------------------------------------------------------------------------
# Hostile input: one line on stderr, the documented exit code, never a hang or a memory blow-up


def _package_command(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`nodewright package ...` as its own process. The timeout and the memory and file-size limits only
    end a run that blocks or eats memory (as these inputs once made it); the tests assert on the output."""
    return subprocess.run(
        [sys.executable, "-m", "nodewright", "package", *argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        preexec_fn=limit_resources,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _make_hostile(package: Path, kind: str, outside: Path) -> str:
    """Turn the package hostile; returns the reason every command must give (after `config.json: `)."""
    config = package / "config.json"
    if kind == "fifo":
        config.unlink()
        os.mkfifo(config)
        return "a FIFO, not a regular file; only regular files are read"
    if kind == "zero":
        config.unlink()
        config.symlink_to("/dev/zero")
        return "a symlink to '/dev/zero', a character device, not a regular file; only regular files are read"
    if kind == "deep":
        config.write_text("[" * 100_000 + "]" * 100_000)
        return "nested deeper than the 32-level limit of arrays and objects (schema v1 needs 5); not decoded"
    script = package / "skyhook_dir" / "apply.sh"
    script.unlink()
    target = str(outside) if kind == "absolute-step" else "../../outside.sh"
    script.symlink_to(target)
    return (
        f"modes.apply[0].path: step 'apply': skyhook_dir/apply.sh leads out of the package through the "
        f"symlink skyhook_dir/apply.sh -> '{target}'; ship the script in the package (a relative symlink "
        "that stays inside the package is fine)"
    )


HOSTILE = ["fifo", "zero", "deep", "absolute-step", "relative-step"]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    script = tmp_path / "outside.sh"
    script.write_text('#!/bin/sh\necho escaped > "$NODEWRIGHT_HOST_ROOT/escaped"\n')
    script.chmod(0o644)
    return script


@pytest.mark.parametrize("kind", HOSTILE)
def test_validate_refuses_hostile_input_in_one_error(package: Path, outside: Path, kind: str) -> None:
    reason = _make_hostile(package, kind, outside)
    result = _package_command("validate", str(package))
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: config.json: {reason}",
        f"{package}: 1 error; package is not usable",
    ]


@pytest.mark.parametrize("kind", HOSTILE)
def test_build_refuses_hostile_input_in_one_line(
    package: Path, outside: Path, tmp_path: Path, kind: str
) -> None:
    reason = _make_hostile(package, kind, outside)
    result = _package_command("build", str(package), "--base", "scratch", "-o", str(tmp_path / "image"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"nodewright package build: {package}/config.json: {reason} (`nodewright package validate {package}` "
        "runs every check)"
    ]
    assert not (tmp_path / "image").exists()


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
def test_run_refuses_an_unusable_config_json_in_one_line(
    package: Path, outside: Path, tmp_path: Path, kind: str
) -> None:
    reason = _make_hostile(package, kind, outside)
    result = _package_command("run", "apply", str(package), "--root", str(tmp_path / "node"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"nodewright package run: {package}/config.json: {reason}"]


@pytest.mark.parametrize("kind", ["absolute-step", "relative-step"])
def test_run_refuses_a_step_leaving_the_package_and_runs_nothing(
    package: Path, outside: Path, tmp_path: Path, kind: str
) -> None:
    reason = _make_hostile(package, kind, outside)
    root = tmp_path / "node"
    result = _package_command("run", "apply", str(package), "--root", str(root))
    assert result.returncode == 1 and "FAILED (agent exit 1)" in result.stdout
    [line] = result.stderr.splitlines()
    copy = root / "var/lib/skyhook/local/gpu-probe-0.1.0-local-1"
    assert line.split(" [agent] ", 1)[1] == f"ERROR: {copy}/config.json: {reason}"
    assert not (root / "escaped").exists() and outside.stat().st_mode & 0o777 == 0o644


def test_a_relative_step_symlink_inside_the_package_is_fine(package: Path, tmp_path: Path) -> None:
    steps = package / "skyhook_dir"
    (steps / "lib").mkdir()
    (steps / "apply.sh").rename(steps / "lib" / "apply.sh")
    (steps / "apply.sh").symlink_to("lib/apply.sh")
    result = _package_command("validate", str(package))
    assert result.returncode == 0 and result.stdout.endswith("gpu-probe 0.1.0 is valid (0 warnings)\n"), (
        result
    )
    assert (
        _package_command("build", str(package), "--base", "scratch", "-o", str(tmp_path / "image")).returncode
        == 0
    )
    run = _package_command("run", "apply", str(package), "--root", str(tmp_path / "node"))
    assert run.returncode == 0, run.stdout + run.stderr


def test_run_names_a_setting_too_large_to_mean_anything_and_exits_2(package: Path, tmp_path: Path) -> None:
    result = _package_command(
        "run", "apply", str(package), "--root", str(tmp_path / "node"),
        "--env", "NODEWRIGHT_AGENT_BUFFER_LIMIT=99999999999999999999",
    )  # fmt: skip
    assert result.returncode == 2 and "FAILED (agent exit 2)" in result.stdout
    [line] = result.stderr.splitlines()
    assert line.split(" [agent] ", 1)[1] == (
        "ERROR: NODEWRIGHT_AGENT_BUFFER_LIMIT='99999999999999999999': expected a whole number of bytes "
        "from 1 to 1048576"
    )


def test_a_fifo_in_the_payload_is_one_line_for_build_and_run(package: Path, tmp_path: Path) -> None:
    fifo = package / "skyhook_dir" / "pipe"
    os.mkfifo(fifo)
    expected = (
        f"{fifo}: not a regular file, directory or symlink (a device, FIFO or socket cannot be part of a "
        "package image); remove it from the package directory"
    )
    build = _package_command("build", str(package), "--base", "scratch", "-o", str(tmp_path / "image"))
    assert (build.returncode, build.stderr.splitlines()) == (1, [f"nodewright package build: {expected}"])
    run = _package_command("run", "apply", str(package), "--root", str(tmp_path / "node"))
    assert (run.returncode, run.stderr.splitlines()) == (1, [f"nodewright package run: {expected}"])


def test_run_refuses_a_config_file_that_is_a_fifo_or_too_large(package: Path, tmp_path: Path) -> None:
    fifo, big = tmp_path / "pipe", tmp_path / "big.conf"
    os.mkfifo(fifo)
    big.write_bytes(b"x" * (1024 * 1024 + 1))
    result = _package_command(
        "run", "config", str(package), "--root", str(tmp_path / "node"),
        "--config", f"a.conf={fifo}", "--config", f"b.conf={big}",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"nodewright package run: --config a.conf={fifo}: a FIFO, not a regular file; "
        "only regular files are read",
        f"nodewright package run: --config b.conf={big}: 1048577 bytes, more than a ConfigMap holds "
        "(1 MiB in all), so no NodeWright could give it to the package",
    ]


@pytest.mark.parametrize("name", ["index.json", "oci-layout"])
def test_build_refuses_base_metadata_that_is_not_a_regular_file(
    package: Path, tmp_path: Path, name: str
) -> None:
    base = _base_layout(tmp_path / "base")
    (tmp_path / "base" / name).unlink()
    (tmp_path / "base" / name).symlink_to("/dev/zero")
    result = _package_command("build", str(package), "--base", base, "-o", str(tmp_path / "image"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"nodewright package build: --base {base}: {tmp_path / 'base' / name}: a symlink to '/dev/zero', a "
        "character device, not a regular file; only regular files are read"
    ]


def test_build_refuses_a_base_layer_that_is_not_a_regular_file(package: Path, tmp_path: Path) -> None:
    base = _base_layout(tmp_path / "base")
    index = json.loads((tmp_path / "base" / "index.json").read_text())
    manifest = json.loads(_blob(tmp_path / "base", index["manifests"][0]))
    digest = manifest["layers"][0]["digest"]
    blob = tmp_path / "base" / "blobs" / "sha256" / digest.removeprefix("sha256:")
    blob.unlink()
    blob.symlink_to("/dev/zero")
    result = _package_command("build", str(package), "--base", base, "-o", str(tmp_path / "image"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"nodewright package build: {tmp_path / 'base'}: the layer blob {digest} is a character device, not "
        f"a regular file ({blob}); copy the base image again"
    ]
    assert not (tmp_path / "image").exists()


def test_payload_depth_costs_no_recursion(tmp_path: Path) -> None:
    """A package tree nested deeper than the recursion limit is listed (build and run copy it), where a
    recursive walk was a RecursionError traceback."""
    depth = 300
    target = str(tmp_path / "pkg")
    os.mkdir(target)
    for _ in range(depth):
        target += "/d"
        os.mkdir(target)
    Path(target, "leaf").write_text("x")
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + depth // 2)  # room for the call, not for one frame a level
    try:
        entries = layout.payload_entries(tmp_path / "pkg")
    finally:
        sys.setrecursionlimit(previous)
    assert [e.relative for e in entries][-2:] == ["/".join(["d"] * depth), "/".join(["d"] * depth) + "/leaf"]
    assert len(entries) == depth + 1
