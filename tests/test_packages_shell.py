"""The shell package (packages/shell): each mode runs the configMap script of the same name.

Scripts write through $NODEWRIGHT_HOST_ROOT (the scratch root here, / on a node), so the tests see what
they did; each check is the user's own script and fails once the change is undone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packages_node import Node, node

HELLO = {
    "apply.sh": '#!/bin/sh\necho hello > "$NODEWRIGHT_HOST_ROOT/etc/hello"\n',
    "apply_check.sh": '#!/bin/sh\ngrep -q hello "$NODEWRIGHT_HOST_ROOT/etc/hello"\n',
}


@pytest.fixture
def host(tmp_path: Path) -> Node:
    host = node(tmp_path)
    host.path("/etc").mkdir(parents=True)
    return host


def test_apply_runs_the_configmaps_script_and_its_check_fails_when_undone(host: Node) -> None:
    config = {**HELLO, "apply.sh": HELLO["apply.sh"] + "echo wrote it\n"}
    text = host.ok("apply", "shell", config)
    assert "running apply.sh from the package's configMap" in text and "[out] wrote it" in text
    assert host.read("/etc/hello") == "hello\n"
    host.ok("apply-check", "shell", config)
    host.path("/etc/hello").unlink()
    text = host.fails("apply-check", "shell", config)
    assert "1 of 1 apply-check steps failed: apply_check" in text


def test_a_mode_without_its_script_has_nothing_to_do(host: Node) -> None:
    assert "no uninstall.sh in the package's configMap: nothing to do" in host.ok("uninstall", "shell", HELLO)
    host.ok("uninstall-check", "shell", HELLO)
    host.ok("post-interrupt", "shell", HELLO)
    host.ok("post-interrupt-check", "shell", HELLO)


def test_a_work_script_without_its_check_fails_the_check(host: Node) -> None:
    config = {**HELLO, "config.sh": '#!/bin/sh\necho configured > "$NODEWRIGHT_HOST_ROOT/etc/config"\n'}
    host.ok("config", "shell", config)
    text = host.fails("config-check", "shell", config)
    assert "the configMap gives config.sh but not config_check.sh: add the check that proves its work" in text
    config["config_check.sh"] = '#!/bin/sh\ntest "$(cat "$NODEWRIGHT_HOST_ROOT/etc/config")" = configured\n'
    host.ok("config-check", "shell", config)
    host.write("/etc/config", "changed\n")
    host.fails("config-check", "shell", config)


def test_a_script_without_shebang_runs_with_sh_and_its_exit_code_counts(host: Node) -> None:
    config = {**HELLO, "config.sh": 'echo "from sh: $0"\nexit 3\n'}
    text = host.fails("config", "shell", config)
    assert "[out] from sh:" in text and "configmaps/config.sh" in text
    assert "config step config FAILED: exit 3 (success: 0)" in text


def test_a_script_with_another_interpreter_runs_with_it(host: Node) -> None:
    config = {
        **HELLO,
        "config.sh": "#!/usr/bin/env python3\nimport sys\nprint('python', sys.version_info[0])\n",
    }
    assert "[out] python 3" in host.ok("config", "shell", config)


def test_upgrade_scripts_see_the_versions(host: Node) -> None:
    host.ok("apply", "shell", HELLO)
    host.ok("apply-check", "shell", HELLO)
    config = {
        **HELLO,
        "upgrade.sh": "#!/bin/sh\n"
        'echo "$PREVIOUS_VERSION -> $CURRENT_VERSION" > "$NODEWRIGHT_HOST_ROOT/etc/up"\n',
        "upgrade_check.sh": '#!/bin/sh\ntest -s "$NODEWRIGHT_HOST_ROOT/etc/up"\n',
    }
    host.ok("upgrade", "shell", config)
    assert host.read("/etc/up") == "1.0.0 -> 1.0.0\n"
    host.ok("upgrade-check", "shell", config)


def test_the_apply_scripts_are_required(host: Node) -> None:
    text = host.fails("apply", "shell", {"apply.sh": "true\n"})
    assert "expected config file configmaps/apply_check.sh is missing" in text
