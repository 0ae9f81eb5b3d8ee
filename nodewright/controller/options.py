"""The operator's options: what `nodewright operator` is told, each with the reason for its default.

`OperatorOptions` is the one definition: every field carries its command-line flag, the kind of value it
takes, its help and why its default is what it is (`option`), and `nodewright operator`'s flags for these
options are generated from it (`cli.operator_cmd.add_option_flags`, `options_from`), so a new option is
one field here. The rollout planner's defaults for `nodewright plan` and `kubectl nodewright why`
(`plan.rollout_input.RolloutOptions`) are the same values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodewright.api import constants
from nodewright.plan.rollout_input import DEFAULT_ADMISSIONS_PER_PASS


def option(default: Any, *, flag: str, kind: str, help: str, why: str) -> Any:
    """A field of `OperatorOptions`: its flag, the kind of value (`cli.operator_cmd.KINDS`), what it does
    and why the default is what it is."""
    return field(default=default, metadata={"flag": flag, "kind": kind, "help": help, "why": why})


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespace: str = option(
        "nodewright-system",
        flag="--namespace",
        kind="dns_label",
        help="namespace of the package pods and the Lease (must exist)",
        why="the Helm chart's namespace",
    )
    agent_image: str = option(
        constants.DEFAULT_AGENT_IMAGE,
        flag="--agent-image",
        kind="image",
        help="image of the stage agent",
        why="the agent released with this operator",
    )
    pause_image: str = option(
        "registry.k8s.io/pause:3.10",
        flag="--pause-image",
        kind="image",
        help="main container image",
        why="the pause image of Kubernetes 1.31+, present on most nodes already",
    )
    runtime_required_taint: str = option(
        f"{constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY}=true:NoSchedule",
        flag="--runtime-required-taint",
        kind="taint",
        help="taint (key[=value]:Effect) kept on nodes until runtime-required NodeWrights complete",
        why="NoSchedule keeps new workloads off without evicting running ones",
    )
    copy_dir_root: str = option(
        "/var/lib/skyhook",
        flag="--copy-dir-root",
        kind="path",
        help="host directory packages are copied to",
        why="the reference operator's directory: its packages run unchanged",
    )
    log_root: str = option(
        "/var/log/skyhook",
        flag="--log-root",
        kind="path",
        help="host directory of stage logs",
        why="the reference operator's directory",
    )
    reboot_timeout: float = option(
        1200.0,
        flag="--reboot-timeout",
        kind="positive_float",
        help="seconds a node may take to come back from a reboot before it is reported erroring",
        why="20 minutes: a GPU node's firmware and driver initialisation can take 10",
    )
    reapply_on_reboot: bool = option(
        False,
        flag="--reapply-on-reboot",
        kind="switch",
        help="re-run every package after a reboot (immutable OS images)",
        why="a mutable host keeps what was applied",
    )
    chain_packages: bool = option(
        True,
        flag="--chain-packages",
        kind="switch",
        help="run the installs of packages that depend only on another package's run in that package's"
        " pod, after it (one pod and two node writes for a dependency chain; docs/stages.md); false gives"
        " every package pods of its own",
        why="the faster mode, fewer pods and node writes (docs/benchmarks.md); off before (CHANGELOG.md)",
    )
    resync_seconds: float = option(
        600.0,
        flag="--resync-seconds",
        kind="float_at_least_1",
        help="seconds between re-checks of a NodeWright with nothing in flight",
        why="progress is event-driven; the resync only catches what an event missed",
    )
    allow_force_drain: bool = option(
        True,
        flag="--allow-force-drain",
        kind="switch",
        help="let drain.policy force delete pods (needs pod delete in all namespaces); when off, such"
        " drains keep evicting and report why",
        why="the policy is the NodeWright author's choice (the chart turns it off unless allowed)",
    )
    keep_succeeded_logs: bool = option(
        False,
        flag="--keep-succeeded-logs",
        kind="switch",
        help="keep the log tail of succeeded stage attempts too (failed ones are always kept, for"
        " `kubectl nodewright package logs`)",
        why="one ConfigMap write per failed attempt only",
    )
    drift_check_limit: int = option(
        4,
        flag="--drift-checks",
        kind="int_at_least_1",
        help="drift-check pods in flight at once across all NodeWrights (driftDetection); keeps checking a"
        " large fleet light for the API server and the nodes",
        why="4 checks a 1,000-node fleet every 5 minutes (docs/benchmarks.md)",
    )
    admissions_per_pass: int = option(
        DEFAULT_ADMISSIONS_PER_PASS,
        flag="--admissions-per-pass",
        kind="int_at_least_1",
        help="node admissions a rollout pass writes per compartment; a bigger batch is admitted over the"
        " next passes, so a large batch does not hold up the other compartments' hand-overs",
        why="32 writes keep a pass well under a second on a loaded API server",
    )
    admission_writers: int = option(
        8,
        flag="--admission-writers",
        kind="int_at_least_1",
        help="admission writes a rollout pass keeps in flight at once (in the plan's order, critical path"
        " first); the node controller starts the admitted nodes' pods behind its reactions to running ones",
        why="8 writes at a loaded API server's ~0.2 s admit ~40 nodes/s (one at a time: ~5/s); more would"
        " take most of the client's 50 writes/s from the node controller",
    )

    @property
    def runtime_required_taint_key(self) -> str:
        return parse_taint(self.runtime_required_taint)[0]


def parse_taint(text: str) -> tuple[str, str | None, str]:
    """`key[=value]:Effect` (kubectl syntax) → (key, value, effect)."""
    spec, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ValueError(f"taint {text!r}: expected key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
    key, has_value, value = spec.partition("=")
    if not key:
        raise ValueError(f"taint {text!r}: empty key")
    return key, (value if has_value else None), effect
