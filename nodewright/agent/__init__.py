"""NodeWright's in-package agent: the program a package pod runs to apply a package to its node.

A package pod's init containers copy the package image's payload onto the host, then run this agent
twice per stage: `<stage> <root_mount> <copy_dir>` does the work (the steps of that mode in the
package's config.json, each chrooted into the host root) and `<stage>-check ...` verifies it. The
operator reads the exit codes. The contract (invocation, modes, config.json schema v1, environment,
flags, history, logs) is the reference NodeWright/Skyhook agent's, so public package images run
unchanged; docs/agent.md describes it and the few places where we differ.

The agent is self-contained: standard library only, Python 3.9 or newer, no import from the rest of
`nodewright` (it runs in a slim image of its own; import-linter keeps it independent of the operator).

Public API (stable; other parts of NodeWright call it):

- `nodewright.agent.main(argv=None, *, environ=None, stdout=None, stderr=None) -> int`: run the agent
  with `argv` (the arguments after the program name) and `environ` (default `os.environ`), return the
  exit code. `nodewright package run` and the simulated kubelet use it or `python -m nodewright.agent`.
- `nodewright.agent.config.load_config(path, *, check_files=True) -> PackageConfig`: read and validate a
  package's config.json; raises `ConfigError` whose `errors` list holds every problem, each starting
  with its field path (`modes.apply[0].returncodes: ...`). `PackageConfig.warnings` holds the
  non-fatal findings. `nodewright package validate` uses it.

Modules: `cli` (arguments), `settings` (environment), `config` (config.json), `engine` (one run),
`runner` and `chroot_exec` (running a step), `state` (flags, history), `logs` (output), `hostfs`
(writing into the host root), `safefile` (reading files handed over: regular files, bounded size
and nesting), `interrupts`, `modes`.
"""

from __future__ import annotations

from nodewright.agent.cli import main
from nodewright.agent.config import ConfigError, PackageConfig, Step, load_config

__all__ = ["ConfigError", "PackageConfig", "Step", "load_config", "main"]
