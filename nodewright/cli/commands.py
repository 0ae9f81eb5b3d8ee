"""The subcommands of `nodewright` (and of `kubectl nodewright`), imported only when they run.

Each command lives in its own module exposing `register(subparsers)`; the module sets a `func` default
on its parser that takes the parsed namespace and returns an exit code. Importing every module up front
cost seconds before `--help` printed anything (the operator's module pulls in the client stack and
OpenTelemetry), so this table carries what the top-level parser needs -- the name and a help line --
and `nodewright.cli.main` imports the one module whose command is being run (all of them only for
shell completion).

`plugin=True` marks the day-2 verbs that `kubectl nodewright` (console script `kubectl-nodewright`)
offers; `nodewright <verb>` offers them too. A command that another issue adds (e.g. `consistency`)
is one more row here and a module with `register`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    module: str
    help: str
    plugin: bool = False
    logs: bool = False
    """A server that configures its own structured logs (others get `cli.output.quiet_logging`)."""


COMMANDS: tuple[Command, ...] = (
    Command("operator", "nodewright.cli.operator_cmd", "run the NodeWright operator (controller)", logs=True),
    Command("webhook", "nodewright.cli.webhook_cmd", "run the admission webhook server", logs=True),
    Command(
        "plan",
        "nodewright.cli.plan_cmd",
        "predict a rollout (compartments, ceilings, batches, blockers) without changing anything",
        plugin=True,
    ),
    Command(
        "demo", "nodewright.cli.demo_cmd", "simulated GPU fleet + operator + a real rollout, to completion"
    ),
    Command("sim", "nodewright.cli.sim_cmd", "local control plane with a simulated GPU fleet"),
    Command(
        "uninstall",
        "nodewright.cli.uninstall_cmd",
        "remove NodeWright from the cluster: NodeWrights, finalizers, node keys and cordons, leftovers",
    ),
    Command(
        "migrate",
        "nodewright.cli.migrate_cmd",
        "take over from the reference operator (Skyhook): objects, node states, cordons (dry run)",
    ),
    Command(
        "consistency",
        "nodewright.cli.consistency_cmd",
        "how uniform the fleet is: package versions, configs, drift, kernels, drivers (skew marked)",
        plugin=True,
    ),
    Command(
        "package",
        "nodewright.cli.plugin.package_verbs",
        "package authoring (init, validate, run, build) and packages on the cluster (status, logs, rerun)",
        plugin=True,
    ),
    Command(
        "status",
        "nodewright.cli.plugin.status_verbs",
        "roll-up of NodeWrights: compartments, batches, slots, halts",
        plugin=True,
    ),
    Command(
        "pause",
        "nodewright.cli.plugin.lifecycle_verbs",
        "stop admitting nodes; nodes in flight keep their cordons",
        plugin=True,
    ),
    Command("resume", "nodewright.cli.plugin.lifecycle_verbs", "undo pause", plugin=True),
    Command(
        "disable",
        "nodewright.cli.plugin.lifecycle_verbs",
        "leave every node alone; cordons are released once running pods finish",
        plugin=True,
    ),
    Command("enable", "nodewright.cli.plugin.lifecycle_verbs", "undo disable", plugin=True),
    Command(
        "approve",
        "nodewright.cli.plugin.approve_verbs",
        "let a compartment waiting at a pauseAfterBatch gate open its next batch",
        plugin=True,
    ),
    Command(
        "history",
        "nodewright.cli.plugin.history_verbs",
        "the revisions (earlier specs) of a NodeWright the operator keeps",
        plugin=True,
    ),
    Command(
        "undo",
        "nodewright.cli.plugin.history_verbs",
        "roll a NodeWright back to an earlier revision, through batches and budgets",
        plugin=True,
    ),
    Command(
        "node",
        "nodewright.cli.plugin.node_verbs",
        "nodes of a NodeWright: list, status, ignore, unignore, reset, retry",
        plugin=True,
    ),
    Command(
        "policy",
        "nodewright.cli.plugin.policy_verbs",
        "DeploymentPolicies: show compartments and ceilings, reset batch state",
        plugin=True,
    ),
    Command(
        "why",
        "nodewright.cli.plugin.why_verbs",
        "why a node is waiting, computed like the operator",
        plugin=True,
    ),
    Command(
        "watch", "nodewright.cli.plugin.watch_verbs", "live full-screen progress of NodeWrights", plugin=True
    ),
    Command(
        "version",
        "nodewright.cli.plugin.version_verbs",
        "the plugin's version and the operator's and webhook's in the cluster",
        plugin=True,
    ),
    Command(
        "completion",
        "nodewright.cli.plugin.completion_verbs",
        "print a shell completion script (bash, zsh)",
        plugin=True,
    ),
)

HIDDEN_COMPLETE = "__complete"
"""The hidden command the completion scripts call: `<prog> __complete <words...>` prints candidates."""


def by_name(*, plugin_only: bool = False) -> dict[str, Command]:
    return {c.name: c for c in COMMANDS if c.plugin or not plugin_only}
