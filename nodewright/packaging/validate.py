"""`nodewright package validate`: everything that would stop a package on a node, found before a rollout.

The agent validates `config.json` when a package pod runs (`nodewright.agent.config.load_config`); a
mistake found there has already cordoned and drained a node. This check runs the same validation, with
every problem at once, and adds what the agent cannot see until it is too late:

- each step script: present (the agent's check), executable, starting with `#!` (the agent execs it;
  a script without one fails with "Exec format error"), without CR line endings (`/bin/sh^M: bad
  interpreter`), and, for `sh`/`bash` scripts, free of syntax errors (`sh -n`, `bash -n`);
- `expected_config_files`: each one a valid ConfigMap key (no `/`): the operator's ConfigMap mount is
  the only thing that fills `configmaps/`, so a name it cannot hold can never be satisfied;
- `package_name`: usable as the package's key in a NodeWright (`spec.packages`) -- a warning, since the
  key and the name may differ, but keeping them equal keeps flags, logs and node state in agreement;
- the `Dockerfile`: present, its final stage not `FROM scratch` (the package pod's init container runs
  `/bin/sh`, `mkdir` and `cp` in the image), and putting the payload under `/skyhook-package`;
- a `README.md` (warning) and a `configmaps/` directory in the package (warning: it is hidden whenever
  the NodeWright gives the package a ConfigMap);
- payload entries an image cannot carry (devices, FIFOs, sockets).

Every file is read as `nodewright.agent.safefile` reads it: regular files only (a FIFO or a symlink to
`/dev/zero` is refused, never opened for a blocking or endless read), at most 1 MiB for config.json and
the Dockerfile, config.json nested at most 32 levels; a step script reached through a symlink that is
absolute or leaves the package is an error naming the step and the target (load_config's rule).

Errors make the package unusable; warnings are printed and do not fail the check.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from nodewright.agent import safefile
from nodewright.agent.config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    ConfigError,
    PackageConfig,
    load_config,
)
from nodewright.api.k8svalidation import config_map_key
from nodewright.packaging import layout

SYNTAX_CHECK_TIMEOUT_S: Final = 10.0
SCRIPT_HEAD_BYTES: Final = 4096  # the shebang and the first lines: enough for the format checks
MAX_DOCKERFILE_BYTES: Final = 1024 * 1024
_SHELLS: Final = {"sh": "sh", "dash": "sh", "ash": "sh", "busybox": "sh", "bash": "bash"}
_FROM: Final = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.IGNORECASE | re.MULTILINE)


@dataclass
class Report:
    package_dir: Path
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: PackageConfig | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def render(self) -> str:
        lines = [f"error: {error}" for error in self.errors]
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        name = f"{self.config.package_name} {self.config.package_version}" if self.config else "package"
        if self.errors:
            count = len(self.errors)
            lines.append(
                f"{self.package_dir}: {count} error{'s' if count != 1 else ''}; {name} is not usable"
            )
        else:
            count = len(self.warnings)
            lines.append(f"{self.package_dir}: {name} is valid ({count} warning{'s' if count != 1 else ''})")
        return "\n".join(lines) + "\n"


def validate_package(package_dir: Path) -> Report:
    """Check a package directory; the report holds every error and warning."""
    report = Report(package_dir)
    if not package_dir.is_dir():
        report.errors.append(f"{package_dir}: not a directory; give the package directory (with config.json)")
        return report
    config_path = package_dir / layout.CONFIG_FILE
    try:
        report.config = load_config(config_path)
    except ConfigError as exc:
        report.errors.extend(f"{layout.CONFIG_FILE}: {error}" for error in exc.errors)
    structure = report.config or _structure_only(config_path)
    if structure is not None:
        report.warnings.extend(f"{layout.CONFIG_FILE}: {warning}" for warning in structure.warnings)
    # The checks below read config.json leniently, so that they run even when the agent refuses it.
    raw = _raw_config(config_path)
    _check_identity(raw, report)
    _check_config_files(raw, report)
    _check_scripts(package_dir, raw, report)
    _check_dockerfile(package_dir, report)
    _check_extras(package_dir, report)
    return report


def _structure_only(config_path: Path) -> PackageConfig | None:
    try:
        return load_config(config_path, check_files=False)
    except ConfigError:
        return None


def _raw_config(config_path: Path) -> dict[str, Any]:
    """config.json as plain data, or {} when load_config has refused it already (and said why)."""
    try:
        text = safefile.read_text(str(config_path), limit=MAX_CONFIG_BYTES)
        data = safefile.loads_json(text, max_depth=MAX_CONFIG_DEPTH)
    except (OSError, ValueError, safefile.Refused):
        return {}
    return data if isinstance(data, dict) else {}


def _check_identity(raw: dict[str, Any], report: Report) -> None:
    name = raw.get("package_name")
    if isinstance(name, str) and not layout.PACKAGE_NAME.match(name):
        report.warnings.append(
            f"{layout.CONFIG_FILE}: package_name {name!r} cannot be a NodeWright spec.packages key "
            f"({layout.PACKAGE_NAME.pattern}); use the same name in both places"
        )


def _check_config_files(raw: dict[str, Any], report: Report) -> None:
    names = raw.get("expected_config_files")
    for index, name in enumerate(names if isinstance(names, list) else []):
        if not isinstance(name, str):
            continue
        for problem in config_map_key(name):
            report.errors.append(
                f"{layout.CONFIG_FILE}: expected_config_files[{index}]: {problem}; the package's ConfigMap "
                "fills configmaps/, and a ConfigMap cannot hold this name"
            )


def _raw_steps(raw: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(mode, index, path) of every step whose path is a plain relative path."""
    found: list[tuple[str, int, str]] = []
    modes = raw.get("modes")
    for mode, steps in (modes if isinstance(modes, dict) else {}).items():
        for index, step in enumerate(steps if isinstance(steps, list) else []):
            path = step.get("path") if isinstance(step, dict) else None
            if isinstance(path, str) and path and not path.startswith("/") and ".." not in path.split("/"):
                found.append((str(mode), index, path))
    return found


def _check_scripts(package_dir: Path, raw: dict[str, Any], report: Report) -> None:
    seen: set[str] = set()
    for mode, index, path in _raw_steps(raw):
        if path in seen:
            continue
        seen.add(path)
        try:
            resolved = safefile.inside(str(package_dir), f"{layout.STEP_DIR}/{path}")
        except OSError:
            continue
        # A missing script, one that is not a regular file or one outside the package: load_config said so.
        if isinstance(resolved, str) and (package_dir / resolved).is_file():
            _check_script(package_dir / resolved, f"{layout.STEP_DIR}/{path} (modes.{mode}[{index}])", report)


def _check_script(script: Path, where: str, report: Report) -> None:
    try:
        with script.open("rb") as handle:
            head = handle.read(SCRIPT_HEAD_BYTES)
    except OSError as exc:
        report.errors.append(f"{where}: cannot be read: {exc.strerror}")
        return
    if not script.stat().st_mode & 0o100:
        report.errors.append(f"{where}: not executable; run chmod +x on it (and commit the mode)")
    first_line = head.split(b"\n", 1)[0]
    if not first_line.startswith(b"#!"):
        report.errors.append(
            f"{where}: does not start with '#!' (e.g. #!/bin/sh); the agent executes the script directly"
        )
        return
    if b"\r\n" in head:
        report.errors.append(
            f"{where}: has Windows (CRLF) line endings; the kernel would look for the interpreter "
            f"'{first_line[2:].strip().decode(errors='replace')}' with a carriage return. Convert to LF"
        )
        return
    shell = _shell_of(first_line)
    if shell is not None:
        _syntax_check(script, shell, where, report)


def _shell_of(shebang: bytes) -> str | None:
    words = shebang[2:].decode(errors="replace").split()
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "env" and len(words) > 1:
        program = words[1]
    return _SHELLS.get(program)


def _syntax_check(script: Path, shell: str, where: str, report: Report) -> None:
    program = shutil.which(shell)
    if program is None:
        report.warnings.append(f"{where}: {shell} is not installed here, so its syntax was not checked")
        return
    try:
        result = subprocess.run(
            [program, "-n", str(script)],
            capture_output=True,
            text=True,
            timeout=SYNTAX_CHECK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        report.warnings.append(f"{where}: {shell} -n did not finish in {SYNTAX_CHECK_TIMEOUT_S:.0f} s")
        return
    if result.returncode != 0:
        detail = " ".join(result.stderr.split()) or f"exit {result.returncode}"
        report.errors.append(f"{where}: {shell} -n finds a syntax error: {detail}")


def _check_dockerfile(package_dir: Path, report: Report) -> None:
    path = package_dir / layout.DOCKERFILE
    if not path.exists():
        report.errors.append(
            f"{layout.DOCKERFILE}: missing; the package image needs one (FROM a base with /bin/sh, "
            f"COPY . {layout.PAYLOAD_DIR}/), or build it with `nodewright package build`"
        )
        return
    try:
        text = safefile.read_bytes(str(path), limit=MAX_DOCKERFILE_BYTES).decode("utf-8", errors="replace")
    except safefile.Refused as exc:
        report.errors.append(f"{layout.DOCKERFILE}: {exc.reason}")
        return
    except OSError as exc:
        report.errors.append(f"{layout.DOCKERFILE}: cannot be read: {exc.strerror}")
        return
    bases = _FROM.findall(text)
    if not bases:
        report.errors.append(f"{layout.DOCKERFILE}: no FROM line")
    elif bases[-1].lower() == "scratch":
        report.errors.append(
            f"{layout.DOCKERFILE}: the image is FROM scratch, but the package pod's init container runs "
            f"/bin/sh -c 'mkdir -p ... && cp -rf {layout.PAYLOAD_DIR}/* ...' in it; use a base with a shell "
            "(e.g. busybox)"
        )
    if layout.PAYLOAD_DIR not in text:
        report.errors.append(
            f"{layout.DOCKERFILE}: never mentions {layout.PAYLOAD_DIR}; the payload (config.json, "
            f"skyhook_dir/) must be copied there (COPY . {layout.PAYLOAD_DIR}/)"
        )


def _check_extras(package_dir: Path, report: Report) -> None:
    if not (package_dir / layout.README).is_file():
        report.warnings.append(
            f"{layout.README}: missing; say what the package changes, its ConfigMap keys and its interrupt"
        )
    if (package_dir / layout.CONFIGMAP_DIR).exists():
        report.warnings.append(
            f"{layout.CONFIGMAP_DIR}/: part of the image, but hidden entirely whenever the NodeWright gives "
            "the package a configMap (it is mounted there); try configs with `run --config key=file`"
        )
    try:
        layout.payload_entries(package_dir)
    except layout.PayloadError as exc:
        if not (exc.path == package_dir / layout.CONFIG_FILE and report.config is None):  # said already
            report.errors.append(str(exc))
    except OSError as exc:
        report.errors.append(f"{exc.filename or package_dir}: cannot be read: {exc.strerror or exc}")


# ----------------------------------------------------------------------------------------------------
# NodeWright manifests: host settings two packages would fight over


@dataclass
class ManifestReport:
    """`nodewright package validate -f`: conflicts between the packages of NodeWright manifests."""

    paths: list[Path]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    nodewrights: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def render(self) -> str:
        lines = [f"error: {error}" for error in self.errors]
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        where = ", ".join(str(p) for p in self.paths)
        verdict = f"{len(self.errors)} error(s)" if self.errors else "no conflicting host settings"
        lines.append(
            f"{where}: {self.nodewrights} NodeWright(s), {verdict} ({len(self.warnings)} warning(s))"
        )
        return "\n".join(lines) + "\n"


def _manifest_nodewrights(path: Path, report: ManifestReport) -> list[dict[str, Any]]:
    import yaml

    try:
        text = safefile.read_text(str(path), limit=MAX_DOCKERFILE_BYTES * 8)
        documents = list(yaml.safe_load_all(text))
    except (OSError, safefile.Refused) as exc:
        report.errors.append(f"{path}: cannot read: {exc}")
        return []
    except yaml.YAMLError as exc:
        report.errors.append(f"{path}: not YAML: {' '.join(str(exc).split())}")
        return []
    found: list[dict[str, Any]] = []
    for doc in documents:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        found.extend(d for d in items or [] if isinstance(d, dict) and d.get("kind") == "NodeWright")
    return found


def validate_manifests(paths: list[Path]) -> ManifestReport:
    """Host settings (docs/packages.md, "Declaring host settings") two packages set differently:

    - two packages of one NodeWright always meet on its nodes, and so do two NodeWrights with the same
      node selector: an error;
    - packages of two NodeWrights with different selectors meet where a node is selected by both, which
      only the cluster knows: a warning naming the label selector of such nodes (none when the selectors
      cannot both match);
    - lines of a recognised ConfigMap key that do not parse: a warning.
    """
    from nodewright.api import hostsettings

    report = ManifestReport(paths)
    nodewrights = [nw for path in paths for nw in _manifest_nodewrights(path, report)]
    report.nodewrights = len(nodewrights)
    for nw in nodewrights:
        name = hostsettings.nodewright_name(nw)
        packages = (nw.get("spec") or {}).get("packages") if isinstance(nw.get("spec"), dict) else None
        for key, package in (packages or {}).items() if isinstance(packages, dict) else ():
            config_map = package.get("configMap") if isinstance(package, dict) else None
            for problem in hostsettings.package_settings(
                config_map if isinstance(config_map, dict) else {}
            ).problems:
                report.warnings.append(f"NodeWright {name!r} package {key!r}: {problem}")
        report.errors.extend(c.describe() for c in hostsettings.conflicts_within(nw))
    for index, ours in enumerate(nodewrights):
        for theirs in nodewrights[index + 1 :]:
            found = hostsettings.conflicts_between(ours, theirs)
            selector = hostsettings.selector_intersection(
                hostsettings.node_selector(ours), hostsettings.node_selector(theirs)
            )
            if not found or selector is None:
                continue
            if _same_nodes(ours, theirs):
                report.errors.extend(f"{c.describe()} -- both select the same nodes" for c in found)
                continue
            where = f"nodes matching {selector!r}" if selector else "every node"
            report.warnings.extend(f"{c.describe()} -- if any node is among {where}" for c in found)
    return report


def _same_nodes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    from nodewright.api.hostsettings import node_selector, selector_intersection

    own = selector_intersection(node_selector(a), node_selector(a))
    return own is not None and own == selector_intersection(node_selector(b), node_selector(b))
