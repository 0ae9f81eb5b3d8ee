"""`kubectl nodewright`: the kubectl plugin for day-2 operations of NodeWright rollouts.

Installed as the console script `kubectl-nodewright` (kubectl finds it on the PATH and runs it for
`kubectl nodewright ...`); every verb is also `nodewright <verb>`. Verbs: pause, resume, disable,
enable, approve, status, node (list, status, ignore, unignore, reset, retry), package (status, logs,
rerun; beside the authoring commands), policy (show, reset), why, watch, plan, consistency, version,
completion. See docs/plugin.md.

Each verb is a small module here registered in `nodewright.cli.commands` (imported only when it
runs, so start-up stays fast); `common` holds kubectl's conventions (flags, output, dry runs,
confirmation, exit codes), `cluster` the reads, `explain` the "why is this node waiting" logic built
on the operator's own planner, `view` the live progress screen shared with `make demo`.
"""

from __future__ import annotations

import sys


def main() -> int:
    from nodewright.cli.main import main as run

    return run(sys.argv[1:], prog="kubectl nodewright", plugin_only=True)


def complete_main() -> int:
    from nodewright.cli.plugin.completion_verbs import kubectl_complete_main

    return kubectl_complete_main()
