"""The simulated node's kernel: the package-manager and boot-loader stand-ins and the booted kernel.

`nodewright.hostroot.hostshims` stands in for dnf/yum/apt-get/grubby/uname on simulated nodes, acting on
the node's root; `nodewright.sim.kubelet_host.boot_node` (`nodewright.hostroot.boot`) starts the boot
loader's default kernel and writes it where `uname -r` reads it. A node-init package pins a kernel with
them and reads it back after the reboot (tests/test_packages_eks_node_init.py, e2e/test_packages_real.py).
"""

from __future__ import annotations

from pathlib import Path

from nodewright.hostroot import boot, hostshims
from nodewright.sim import kubelet_host
from nodewright.sim.kubeapi import JSON

IMAGE = "5.15.0-1063-nvidia"


def _node(boot_id: str = "b-1") -> JSON:
    return {"metadata": {"name": "n1"}, "status": {"nodeInfo": {"bootID": boot_id, "kernelVersion": IMAGE}}}


def _run(root: Path, program: str, *args: str) -> tuple[int, list[str], list[str]]:
    n = hostshims.Node(root, root / "state")
    out: list[str] = []
    err: list[str] = []
    if program in ("dnf", "yum", "apt-get"):
        return hostshims.package_manager(n, program, args, out.append, err.append), out, err
    if program == "grubby":
        return hostshims.grubby(n, args, out.append, err.append), out, err
    return hostshims.uname(n, args, out.append), out, err


def test_the_first_boot_installs_and_runs_the_images_kernel(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert kubelet_host.boot_node(root, _node()) == IMAGE
    assert (root / f"boot/vmlinuz-{IMAGE}").is_file() and (root / f"lib/modules/{IMAGE}").is_dir()
    assert (root / "proc/sys/kernel/osrelease").read_text() == IMAGE + "\n"
    assert (root / "proc/cmdline").read_text().startswith(f"BOOT_IMAGE=/boot/vmlinuz-{IMAGE} ")
    assert _run(root, "uname", "-r")[1] == [IMAGE]
    assert _run(root, "uname", "-sr")[1] == [f"Linux {IMAGE}"]
    assert _run(root, "uname")[1] == ["Linux"]


def test_dnf_installs_a_kernel_that_grubby_makes_the_default_and_the_boot_runs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    kubelet_host.boot_node(root, _node())
    pinned = "6.1.132-147.221.amzn2023.x86_64"
    code, out, _ = _run(root, "dnf", "install", "-y", f"kernel-{pinned}", "kernel-devel-6.1.132")
    assert code == 0 and out == [f"Installed: kernel-{pinned}", "Installed: kernel-devel-6.1.132"]
    assert (root / f"boot/vmlinuz-{pinned}").is_file() and (root / f"lib/modules/{pinned}").is_dir()
    assert not (root / "boot/vmlinuz-6.1.132").exists(), "a devel package holds no kernel image"
    assert _run(root, "grubby", "--default-kernel")[1] == [f"/boot/vmlinuz-{pinned}"], "as AL2023 does"
    assert _run(root, "grubby", f"--set-default=/boot/vmlinuz-{IMAGE}")[0] == 0
    assert _run(root, "grubby", "--default-kernel")[1] == [f"/boot/vmlinuz-{IMAGE}"]
    assert kubelet_host.boot_node(root, _node("b-2")) == IMAGE
    assert _run(root, "grubby", "--set-default", f"/boot/vmlinuz-{pinned}")[0] == 0
    assert "saved_entry=" + pinned in (root / "boot/grub2/grubenv").read_text()
    assert kubelet_host.boot_node(root, _node("b-3")) == pinned
    assert (root / "proc/sys/kernel/osrelease").read_text() == pinned + "\n"
    assert _run(root, "uname", "-r")[1] == [pinned]

    code, _, err = _run(root, "grubby", "--set-default", "/boot/vmlinuz-9.9.9")
    assert code == 1 and err == ["The param /boot/vmlinuz-9.9.9 is incorrect"]
    code, _, err = _run(root, "dnf", "remove", "-y", f"kernel-{pinned}")
    assert code == 1 and "would remove the running kernel" in err[0]
    assert _run(root, "dnf", "install", "-y", "kernel-6.1.141-1.amzn2023.x86_64")[0] == 0
    assert _run(root, "yum", "remove", "-y", "kernel-6.1.141-1.amzn2023.x86_64")[0] == 0
    assert not (root / "boot/vmlinuz-6.1.141-1.amzn2023.x86_64").exists()
    assert hostshims.installed_packages(hostshims.Node(root, root)) == [
        f"kernel-{pinned}",
        "kernel-devel-6.1.132",
    ]


def test_apt_installs_a_kernel_and_grubs_default_entry_boots_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    kubelet_host.boot_node(root, _node())
    pinned = "6.8.0-1024-aws"
    args = ("-o", "Dpkg::Options::=--force-confold", "install", "-y", f"linux-image-{pinned}")
    assert _run(root, "apt-get", "update")[0] == 0
    assert _run(root, "apt-get", *args)[0] == 0
    assert kubelet_host.boot_node(root, _node("b-2")) == IMAGE, "installing does not change GRUB's default"
    (root / "etc/default/grub.d").mkdir(parents=True)
    (root / "etc/default/grub").write_text("GRUB_DEFAULT=0\n")
    (root / "etc/default/grub.d/zz-pin.cfg").write_text(
        f'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux {pinned}"\n'
    )
    assert boot.grub_default(root) == f"Advanced options for Ubuntu>Ubuntu, with Linux {pinned}"
    assert kubelet_host.boot_node(root, _node("b-3")) == pinned
    (root / "etc/default/grub.d/zz-pin.cfg").write_text('GRUB_DEFAULT="Ubuntu, with Linux 9.9.9-1-aws"\n')
    assert kubelet_host.boot_node(root, _node("b-4")) == IMAGE, "an entry for a kernel not installed"
    code, _, err = _run(root, "apt-get", "frobnicate")
    assert code == 1 and "'frobnicate' is not simulated" in err[0]


def test_the_stand_ins_are_installed_with_the_others(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    hostshims.install(bin_dir, python="/usr/bin/python3", source_root="/src", root=tmp_path, state=tmp_path)
    assert {"dnf", "yum", "apt-get", "grubby", "uname"} <= {p.name for p in bin_dir.iterdir()}
