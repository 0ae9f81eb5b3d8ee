"""`nodewright package`: write, check, try and build a package without a cluster.

    nodewright package init NAME [--dir D]
    nodewright package validate [DIR]... [-f NODEWRIGHT.yaml]...
    nodewright package run MODE DIR --root ROOT [--config KEY=FILE]... [--env K=V]... [--chroot]
                                             [--interrupt TYPE [--service UNIT]...] [--nodewright NAME]
    nodewright package build DIR --base scratch|LAYOUT[:REF] -o OUT [--tag T] [--platform OS/ARCH] [--force]

`init` scaffolds a package that passes its own checks; `validate` reports everything the agent or a
package pod would refuse, all at once (exit 1 if anything is wrong); `run` stages the package under a
directory standing for a node's root as a package pod does and runs one agent mode on it (exit code:
the agent's), and after the interrupt mode plays the node's part on the root (a reboot boots it, as a
simulated node boots); `build` writes the package image as an OCI image layout that skopeo, crane or oras can
push. The work is in `nodewright.packaging` (see its modules); this module parses flags and prints.
Nothing of the operator's client stack is imported, so the command starts quickly.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Final

from nodewright.cli import flags

PROG: Final = "nodewright package"
#: The CRD's interrupt names (spec.packages[].interrupt.type) and the agent's own, to the agent's.
INTERRUPT_TYPES: Final = {
    "reboot": "node_restart",
    "service": "service_restart",
    "restartAllServices": "restart_all_services",
    "noop": "no_op",
    "node_restart": "node_restart",
    "service_restart": "service_restart",
    "restart_all_services": "restart_all_services",
    "no_op": "no_op",
}


def key_value(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (argparse type); the value may contain '='."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


DESCRIPTION: Final = """\
Write, check, try and build NodeWright packages, without a cluster:

  init NAME                 scaffold a package that passes its own checks
  validate DIR              everything the agent or a package pod would refuse, all at once
  validate -f MANIFEST      packages of NodeWrights that set one sysctl or kernel parameter differently
  run MODE DIR --root ROOT  run one agent mode against a directory standing for a node's root
  build DIR --base B -o OUT write the package image as an OCI image layout (push it with skopeo,
                            crane or oras)

See docs/packages.md.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "package",
        help="write, validate, try and build packages (no cluster needed)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=lambda _args: _usage(parser))
    commands = parser.add_subparsers(dest="package_command", metavar="COMMAND")

    init = commands.add_parser("init", help="scaffold a new package that passes its own checks")
    init.add_argument("name", help="package name (lowercase, '-', 2-43 characters; its NodeWright key)")
    init.add_argument("--dir", type=Path, default=None, help="directory to create (default: ./NAME)")
    init.set_defaults(func=run_init)

    validate = commands.add_parser(
        "validate",
        help="check a package as the agent and a package pod would (-f: conflicting host settings)",
    )
    validate.add_argument("directory", type=Path, nargs="*", help="package directories (with config.json)")
    validate.add_argument(
        "-f",
        "--filename",
        type=flags.existing_file,
        action="append",
        default=[],
        metavar="MANIFEST",
        help="NodeWright manifests: report packages that set one sysctl or kernel parameter to different"
        " values (repeatable; docs/packages.md, 'Declaring host settings')",
    )
    validate.set_defaults(func=run_validate)

    run = commands.add_parser(
        "run", help="run one agent mode of a package against a directory standing for a node's root"
    )
    run.add_argument("mode", help="apply, apply-check, config, config-check, uninstall, post-interrupt, ...")
    run.add_argument("directory", type=Path, help="the package directory")
    run.add_argument("--root", type=Path, required=True, help="the node's root: a scratch directory")
    run.add_argument(
        "--config",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=FILE",
        help="a ConfigMap entry: FILE's content as configmaps/KEY (repeatable; replaces the payload's)",
    )
    run.add_argument(
        "--env", type=key_value, action="append", default=[], metavar="K=V", help="package env (repeatable)"
    )
    run.add_argument("--chroot", action="store_true", help="chroot each step into the root (root only)")
    run.add_argument(
        "--interrupt",
        choices=sorted(INTERRUPT_TYPES),
        metavar="TYPE",
        help="the interrupt mode's interrupt: reboot (the root then boots), service, restartAllServices or "
        "noop",
    )
    run.add_argument("--service", action="append", default=[], help="a unit for --interrupt service")
    run.add_argument(
        "--nodewright",
        type=flags.nodewright_name,
        default="local",
        help="the NodeWright name the run pretends to belong to (names the state and log directories)",
    )
    run.set_defaults(func=run_run)

    build = commands.add_parser("build", help="write the package image as an OCI image layout")
    build.add_argument("directory", type=Path, help="the package directory")
    build.add_argument(
        "--base", required=True, help="'scratch' or a local OCI layout directory, PATH or PATH:REF"
    )
    build.add_argument("-o", "--output", type=Path, required=True, help="the OCI layout directory to write")
    build.add_argument("--tag", default=None, help="the image's ref name (default: the package version)")
    build.add_argument(
        "--platform", default=None, help="os/arch[/variant] (default: the base's, or linux/amd64)"
    )
    build.add_argument("--force", action="store_true", help="replace an existing OCI layout at -o")
    build.set_defaults(func=run_build)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return flags.USAGE_ERROR


def run_init(args: argparse.Namespace) -> int:
    from nodewright.packaging import scaffold

    target: Path = args.dir if args.dir is not None else Path(args.name)
    try:
        written = scaffold.create(args.name, target)
    except scaffold.ScaffoldError as exc:
        return flags.fail(f"{PROG} init", exc)
    except OSError as exc:
        return flags.fail(f"{PROG} init", f"{exc.filename or target}: {exc.strerror}")
    print(f"created package {args.name} {scaffold.INITIAL_VERSION} in {target} ({len(written)} files)")
    print(f"next: nodewright package validate {target}")
    print(f"      nodewright package run apply {target} --root $(mktemp -d)   (see {target}/README.md)")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from nodewright.packaging.validate import validate_manifests, validate_package

    if not args.directory and not args.filename:
        return flags.fail(f"{PROG} validate", "give a package directory, or -f with NodeWright manifests")
    reports = [validate_package(directory) for directory in args.directory]
    ok = True
    for report in reports:
        (sys.stdout if report.ok else sys.stderr).write(report.render())
        ok = ok and report.ok
    if args.filename:
        manifests = validate_manifests(list(args.filename))
        (sys.stdout if manifests.ok else sys.stderr).write(manifests.render())
        ok = ok and manifests.ok
    return 0 if ok else 1


def run_run(args: argparse.Namespace) -> int:
    from nodewright.agent.config import ConfigError
    from nodewright.agent.interrupts import Interrupt
    from nodewright.agent.safefile import Refused
    from nodewright.packaging import layout, localrun

    prog = f"{PROG} run"
    if args.service and args.interrupt not in ("service", "service_restart"):
        return flags.fail(prog, "--service only goes with --interrupt service")
    interrupt = None
    if args.interrupt is not None:
        kind = INTERRUPT_TYPES[args.interrupt]
        if kind == "service_restart" and not args.service:
            return flags.fail(prog, "--interrupt service needs at least one --service UNIT")
        interrupt = Interrupt(type=kind, services=tuple(args.service))
    configs = {key: Path(value) for key, value in args.config} if args.config else None
    request = localrun.RunRequest(
        mode=args.mode,
        package_dir=args.directory,
        root=args.root,
        configs=configs,
        env=dict(args.env),
        chroot=args.chroot,
        interrupt=interrupt,
        identity=layout.Identity(nodewright=args.nodewright),
    )
    try:
        result = localrun.run(request)
    except localrun.RunRequestError as exc:
        for problem in exc.problems[:-1]:
            print(f"{prog}: {problem}", file=sys.stderr)
        return flags.fail(prog, exc.problems[-1])
    except (ConfigError, layout.PayloadError, Refused) as exc:  # the package (or a --config file) is unusable
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc.filename or args.root}: {exc.strerror}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    verdict = "succeeded" if result.succeeded else "FAILED"
    print(
        f"{prog}: {args.mode} of {result.package} {result.version} {verdict} (agent exit {result.code})\n"
        f"  root {args.root}: package copied to {result.copy_dir}\n"
        f"  flags and history: {result.state_dir}\n"
        f"  step logs: {result.log_dir}"
    )
    if args.mode == "interrupt" and not args.chroot:
        print(
            f"  interrupt commands recorded, not run on this machine: {result.state_dir}/"
            f"{localrun.REQUESTS_FILE}; the node's part, played on the root:"
        )
        for action in result.node_actions:
            print(f"    {' '.join(action.command)}: {action.effect}")
    return result.code


def run_build(args: argparse.Namespace) -> int:
    from nodewright.packaging import oci

    prog = f"{PROG} build"
    epoch_text = os.environ.get("SOURCE_DATE_EPOCH", "0") or "0"
    try:
        epoch = int(epoch_text)
    except ValueError:
        return flags.fail(prog, f"SOURCE_DATE_EPOCH={epoch_text!r} is not a whole number of seconds")
    try:
        result = oci.build(
            args.directory,
            base=args.base,
            output=args.output,
            tag=args.tag,
            platform=args.platform,
            epoch=epoch,
            force=args.force,
        )
    except oci.BuildError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc.filename or args.output}: {exc.strerror}", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    print(
        f"wrote {result.layout} (OCI image layout), {result.platform}, tag {result.tag}\n"
        f"  manifest {result.manifest_digest}\n"
        f"  payload layer {result.layer_digest} ({result.layer_size} bytes, {result.payload_entries} entries "
        f"under /skyhook-package), base {result.base}\n"
        f"push: skopeo copy oci:{result.layout}:{result.tag} docker://REGISTRY/REPOSITORY:{result.tag}\n"
        f"  or: crane push {result.layout} REGISTRY/REPOSITORY:{result.tag}"
    )
    return 0
