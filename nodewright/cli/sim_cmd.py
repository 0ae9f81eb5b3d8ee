"""`nodewright sim up|down|status|push`: a local control plane with a simulated GPU fleet.

`up` generates certificates and a kubeconfig in `--dir`, starts etcd, kube-apiserver,
kube-controller-manager, kwok, the rebooter and the simulated kubelet on free loopback ports, waits until
each is healthy, creates the fleet (and optionally training-job workloads), prints the kubeconfig path and
returns with the processes running. `--real-packages K` opts the first K nodes in to the simulated
kubelet, which runs their pods' containers for real against `<dir>/roots/<node>/` (kwok plays the rest).
`--real-nodes K` adds K real nodes (a real kubelet and containerd each, in a box; docs/simulator.md), a
scheduler and the registry they pull from; `push` (or `up --push`) puts image layouts into that registry.
`down` stops exactly the processes recorded in `--dir` and removes it. `status` says what runs, with the
log tail of any component that died. Clusters in different `--dir`s are independent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from nodewright.cli import flags

DEFAULT_DIR = Path(".sim") / "default"
MAX_NODES = 99_999
"""Node names are `<prefix>-<index:05d>`: more nodes would make longer names than the prefix check allows."""
MAX_REAL_NODES = 16
"""Each real node costs about 130 MiB and a share of two cores; the lab network has room for 240."""


def node_name_prefix(text: str) -> str:
    """A prefix for `<prefix>-<index:05d>` node names, which are also `kubernetes.io/hostname` label
    values: a DNS label short enough for the suffix to fit in 63 characters."""
    flags.dns_label(text)
    if len(text) > 63 - len("-00000"):
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {63 - len('-00000')} characters")
    return text


def layout_and_image(text: str) -> tuple[Path, str]:
    layout, sep, image = text.partition("=")
    if not sep or not layout or not image:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LAYOUT=IMAGE")
    return existing_directory(layout), flags.image_reference(image)


def existing_directory(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = subparsers.add_parser("sim", help="local control plane with a simulated GPU fleet")
    commands = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND", required=True)

    up = commands.add_parser("up", help="start a control plane and create the simulated fleet")
    up.add_argument(
        "--nodes",
        type=flags.int_at_least(0, at_most=MAX_NODES),
        default=10,
        help="number of simulated GPU nodes (default 10)",
    )
    up.add_argument("--profile", choices=("h100", "b200", "mixed"), default="h100", help="GPU node model")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})")
    up.add_argument(
        "--name-prefix", type=node_name_prefix, default="gpu-node", help="node names are <prefix>-<index:05d>"
    )
    up.add_argument("--workloads", action="store_true", help="also create training-job pods with PDBs")
    up.add_argument(
        "--real-packages",
        type=flags.int_at_least(0, at_most=MAX_NODES),
        default=0,
        metavar="K",
        help="the first K nodes run their pods for real (the simulated kubelet) instead of kwok (default 0)",
    )
    up.add_argument(
        "--real-nodes",
        type=flags.int_at_least(0, at_most=MAX_REAL_NODES),
        default=0,
        metavar="K",
        help="also K real nodes: a real kubelet and containerd each, in a box of its own (needs root and "
        "`make realnode`; docs/simulator.md)",
    )
    up.add_argument(
        "--push",
        action="append",
        default=[],
        metavar="LAYOUT=IMAGE",
        type=layout_and_image,
        help="push an OCI image layout to the real nodes' registry as IMAGE (repeatable; e.g. "
        "build/images/agent=ghcr.io/nodewright/agent:0.1.0)",
    )
    up.add_argument(
        "--image-dir",
        type=existing_directory,
        action="append",
        default=[],
        help="directory registry of package images for the simulated kubelet: <name>/ or <name>/<tag>/ is an "
        "OCI image layout (nodewright package build -o) or a package directory (repeatable; <dir>/registry "
        "and the repository's packages/ are always searched)",
    )
    up.add_argument(
        "--agent-image",
        type=flags.image_reference,
        action="append",
        default=[],
        help="image the simulated kubelet runs as our agent (repeatable; any repository ending in /agent is)",
    )
    up.set_defaults(func=cmd_up)

    down = commands.add_parser("down", help="stop the control plane recorded in --dir and remove its state")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    down.set_defaults(func=cmd_down)

    push = commands.add_parser("push", help="push an OCI image layout to the real nodes' registry")
    push.add_argument(
        "layout", type=existing_directory, help="OCI image layout directory (make images, package build)"
    )
    push.add_argument("image", type=flags.image_reference, help="the reference real nodes pull it by")
    push.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    push.set_defaults(func=cmd_push)

    status = commands.add_parser("status", help="show which components run")
    status.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    status.set_defaults(func=cmd_status)


def cmd_up(args: argparse.Namespace) -> int:
    from nodewright.sim import binaries, fleet
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError

    if args.real_packages > args.nodes:
        return flags.fail(
            "nodewright sim up", f"--real-packages {args.real_packages} is more than --nodes {args.nodes}"
        )
    if args.push and not args.real_nodes:
        return flags.fail(
            "nodewright sim up", "--push needs --real-nodes (only real nodes pull from the registry)"
        )
    try:
        plane = ControlPlane.create(
            args.dir, image_dirs=args.image_dir, agent_images=args.agent_image, real_nodes=args.real_nodes
        )
    except OSError as err:
        return flags.fail("nodewright sim up", f"--dir {args.dir}: cannot create it: {err.strerror or err}")
    except (binaries.BinariesMissingError, ControlPlaneError) as err:
        print(f"sim up failed: {flags.one_line(err)}", file=sys.stderr)
        return 1
    try:
        seconds = plane.up()
    except (binaries.BinariesMissingError, ControlPlaneError, OSError) as err:
        print(f"sim up failed: {flags.one_line(err)}", file=sys.stderr)
        return 1
    print(f"control plane up in {seconds:.1f}s: {plane.server}", file=sys.stderr)
    if plane.real_nodes:
        print(
            f"{plane.real_nodes} real node(s) Ready: {', '.join(plane.real_node_names)} "
            f"(registry {plane.registry}; boxes in {plane.dir / 'realnodes' / 'nodes'})",
            file=sys.stderr,
        )
    try:
        for layout, image in args.push:
            digest = plane.push_image(layout, image)
            print(f"pushed {layout} as {image} ({digest})", file=sys.stderr)
        if args.nodes:
            started = time.monotonic()
            names = asyncio.run(
                fleet.create_nodes(
                    plane.kubeconfig,
                    count=args.nodes,
                    profile=args.profile,
                    name_prefix=args.name_prefix,
                    real_packages=args.real_packages,
                )
            )
            print(
                f"created {len(names)} {args.profile} nodes in {time.monotonic() - started:.1f}s",
                file=sys.stderr,
            )
            if args.real_packages:
                print(
                    f"{args.real_packages} of them run their pods for real: "
                    f"{', '.join(names[: args.real_packages])} (host roots in {plane.dir / 'roots'})",
                    file=sys.stderr,
                )
            if args.workloads:
                jobs = asyncio.run(fleet.create_demo_workloads(plane.kubeconfig, names))
                pods = sum(len(j.pods) for j in jobs)
                print(
                    f"created {len(jobs)} training jobs ({pods} pods) in namespace sim-workloads",
                    file=sys.stderr,
                )
    except Exception as err:
        # Leave nothing half-running behind a failed `up`.
        plane.down()
        print(f"sim up failed while creating the fleet: {err!r}", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={plane.kubeconfig}", file=sys.stderr)
    print(f"kubectl: {plane.bin_dir / 'kubectl'}", file=sys.stderr)
    print(plane.kubeconfig)
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError
    from nodewright.sim.registry import RegistryError

    try:
        plane = ControlPlane.load(args.dir)
        digest = plane.push_image(args.layout, args.image)
    except (ControlPlaneError, RegistryError) as err:
        print(f"sim push failed: {flags.one_line(err)}", file=sys.stderr)
        return 1
    print(digest)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError

    try:
        plane = ControlPlane.load(args.dir)
    except ControlPlaneError as err:
        print(f"nothing to stop: {err}", file=sys.stderr)
        return 0
    stopped = plane.down()
    print(
        f"stopped {', '.join(stopped) or 'nothing (no process was running)'}; "
        f"removed its state from {plane.dir}",
        file=sys.stderr,
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError

    try:
        plane = ControlPlane.load(args.dir)
    except ControlPlaneError as err:
        print(f"not running: {err}")
        return 3
    report: dict[str, dict[str, Any]] = plane.status()
    print(f"dir: {plane.dir}\nserver: {plane.server}\nkubeconfig: {plane.kubeconfig}")
    for name, entry in report.items():
        state = "running" if entry["running"] else ("DIED" if entry["pid"] is not None else "stopped")
        print(f"  {name:<24} {state:<8} pid={entry['pid']} log={entry['log']}")
        if "log_tail" in entry:
            print("    " + entry["log_tail"].replace("\n", "\n    "))
    for node, record in plane.real_node_status().items():
        last = record.get("last_end") or "-"
        print(f"  {node:<24} {record.get('state', '?'):<8} boots={record.get('boots')} last={last}")
    return 0 if all(e["running"] for e in report.values()) else 1


if __name__ == "__main__":  # lets `python -m nodewright.cli.sim_cmd sim up ...` work before it is wired in
    from nodewright.cli.main import main

    sys.exit(main())
