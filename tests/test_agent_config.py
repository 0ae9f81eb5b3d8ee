"""config.json schema v1 as the agent loads it: every rule, every problem reported at once by field path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.agent.config import SEMVER, ConfigError, check_script_name, load_config, parse_config
from tests.agent_fixtures.hostroot import step


def _config(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_version": "v1",
        "package_name": "demo",
        "package_version": "1.2.3",
        "expected_config_files": ["a.conf"],
        "modes": {
            "apply": [step("apply.sh", arguments=["env:NODE", "x"], env={"K": "v"})],
            "apply-check": [step("apply_check.sh", returncodes=[0, 2])],
        },
    }
    body.update(overrides)
    return body


def _errors(data: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return caught.value.errors


def _write_package(tmp_path: Path, data: dict[str, Any], scripts: list[str]) -> Path:
    (tmp_path / "skyhook_dir").mkdir()
    for name in scripts:
        (tmp_path / "skyhook_dir" / name).write_text("#!/bin/sh\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    return config


def test_a_valid_config_loads_with_every_step_field() -> None:
    config = parse_config(_config())
    assert (config.schema_version, config.package_name, config.package_version) == ("v1", "demo", "1.2.3")
    assert config.expected_config_files == ("a.conf",)
    apply = config.steps("apply")[0]
    assert apply.path == "apply.sh" and apply.arguments == ("env:NODE", "x")
    assert apply.env == {"K": "v"} and apply.returncodes == (0,)
    assert (apply.on_host, apply.idempotence, apply.upgrade_step) == (True, False, False)
    assert config.steps("apply-check")[0].returncodes == (0, 2)
    assert config.steps("config") == ()
    assert config.warnings == ()


def test_env_is_optional_and_the_reference_root_dir_key_is_accepted() -> None:
    data = _config(root_dir="/whatever")
    del data["modes"]["apply"][0]["env"]
    config = parse_config(data)
    assert config.steps("apply")[0].env == {}
    assert config.warnings == ()


def test_every_problem_is_reported_at_once_with_its_field_path() -> None:
    data = _config(schema_version="v2", package_version="1.2", expected_config_files="a.conf")
    data["modes"]["apply"][0].update(returncodes=[], on_host="yes", name="bad name!")
    del data["modes"]["apply-check"][0]["idempotence"]
    errors = _errors(data)
    paths = [error.split(":", 1)[0] for error in errors]
    assert paths == [
        "schema_version",
        "package_version",
        "expected_config_files",
        "modes.apply[0].name",
        "modes.apply[0].returncodes",
        "modes.apply[0].on_host",
        "modes.apply-check[0].idempotence",
    ]
    assert "'v2' is not supported; use one of: v1" in errors[0]
    assert 'got "yes"' in errors[5]
    assert "required field missing" in errors[6]


def test_config_error_names_the_file_and_lists_every_problem(tmp_path: Path) -> None:
    path = _write_package(tmp_path, _config(package_version="x", schema_version=1), ["apply.sh"])
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: 3 problems:")
    assert "  - schema_version: expected a non-empty string, got 1" in text
    assert "  - package_version: 'x' is not a full semantic version" in text
    assert "  - modes.apply-check[0].path: 'apply_check.sh' not found in" in text
    assert caught.value.source == str(path)


def test_missing_top_level_fields_are_each_named() -> None:
    errors = _errors({})
    assert [e.split(":", 1)[0] for e in errors] == [
        "schema_version",
        "package_name",
        "package_version",
        "expected_config_files",
        "modes",
    ]
    assert _errors([]) == ["(top level): expected a JSON object, got []"]


def test_unknown_mode_is_an_error_with_a_suggestion() -> None:
    data = _config()
    data["modes"]["aply"] = []
    (error,) = _errors(data)
    assert error.startswith("modes.aply: unknown mode (did you mean 'apply'?); valid modes: apply, config")


def test_a_mode_with_steps_needs_its_check_mode_with_steps() -> None:
    data = _config()
    data["modes"]["config"] = [step("config.sh")]
    data["modes"]["post-interrupt"] = [step("post.sh")]
    data["modes"]["post-interrupt-check"] = []
    errors = _errors(data)
    assert errors == [
        "modes.config-check: config has steps but config-check has none; add a check step that verifies "
        "config's work",
        "modes.post-interrupt-check: post-interrupt has steps but post-interrupt-check has none; add a check "
        "step that verifies post-interrupt's work",
    ]


def test_only_check_modes_or_no_steps_at_all_are_errors() -> None:
    only_checks = _config(modes={"apply-check": [step("apply_check.sh")]})
    assert _errors(only_checks) == [
        "modes: only check modes are defined; add at least one of apply, config, upgrade, uninstall, "
        "post-interrupt"
    ]
    empty = _config(modes={"apply": [], "apply-check": []})
    assert _errors(empty) == ["modes: no mode has any step; define at least the apply and apply-check steps"]


def test_upgrade_steps_only_in_upgrade_modes_and_without_arguments() -> None:
    data = _config()
    data["modes"]["apply"][0]["upgrade_step"] = True
    data["modes"]["upgrade"] = [step("upgrade.sh", upgrade_step=True)]
    data["modes"]["upgrade-check"] = [step("upgrade_check.sh", upgrade_step=True, arguments=["a"])]
    errors = _errors(data)
    assert errors == [
        "modes.apply[0].arguments: an upgrade_step takes no arguments: it is given the previous and the new "
        "version",
        "modes.upgrade-check[0].arguments: an upgrade_step takes no arguments: it is given the previous and "
        "the new version",
    ]
    data["modes"]["apply"][0]["arguments"] = []
    data["modes"]["upgrade-check"][0]["arguments"] = []
    assert _errors(data) == [
        "modes.apply[0].upgrade_step: upgrade steps are only allowed in the upgrade and upgrade-check modes"
    ]


def test_paths_must_stay_inside_their_directories() -> None:
    data = _config(expected_config_files=["../secret", "ok.conf", "/etc/abs"])
    data["modes"]["apply"][0]["path"] = "../outside.sh"
    data["modes"]["apply-check"][0]["path"] = "/bin/true"
    paths = [e.split(":", 1)[0] for e in _errors(data)]
    assert paths == [
        "expected_config_files[0]",
        "expected_config_files[2]",
        "modes.apply[0].path",
        "modes.apply-check[0].path",
    ]


def test_package_name_must_be_usable_in_file_names() -> None:
    assert _errors(_config(package_name="a/b")) == [
        "package_name: 'a/b' cannot name files (it names the flag, log and history files)"
    ]


def test_field_types_are_strict() -> None:
    data = _config()
    data["modes"]["apply"][0].update(returncodes=[True], arguments=["a", 1], env={"K": 1}, idempotence=0)
    data["modes"]["apply-check"] = {"not": "a list"}
    errors = _errors(data)
    assert [e.split(":", 1)[0] for e in errors] == [
        "modes.apply[0].arguments",
        "modes.apply[0].returncodes",
        "modes.apply[0].idempotence",
        "modes.apply[0].env",
        "modes.apply-check",
    ]


def test_env_argument_needs_a_variable_name() -> None:
    data = _config()
    data["modes"]["apply"][0]["arguments"] = ["env:"]
    assert _errors(data) == [
        "modes.apply[0].arguments[0]: 'env:' needs a variable name, e.g. 'env:NODE_NAME'"
    ]


def test_missing_step_scripts_are_errors_unless_files_are_not_checked(tmp_path: Path) -> None:
    path = _write_package(tmp_path, _config(), ["apply.sh"])
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.errors == [
        f"modes.apply-check[0].path: 'apply_check.sh' not found in {tmp_path / 'skyhook_dir'}; "
        "add the script or fix the path"
    ]
    assert load_config(path, check_files=False).package_name == "demo"
    (tmp_path / "skyhook_dir" / "apply_check.sh").write_text("#!/bin/sh\n")
    assert load_config(path).steps("apply-check")[0].path == "apply_check.sh"


def test_missing_check_scripts_unknown_fields_and_interrupt_steps_are_warnings() -> None:
    data = _config(extra_top=1)
    data["modes"]["apply"].append(step("other.sh", timeout=3))
    data["modes"]["interrupt"] = [step("never.sh")]
    config = parse_config(data)
    assert config.warnings == (
        "extra_top: unknown field (ignored)",
        "modes.apply[1].timeout: unknown step field (ignored)",
        "modes.interrupt: steps are never run: the interrupt mode runs the interrupt the operator passes",
        "modes.apply[1].path: no check step runs 'other_check.sh'; a check per step shows that its work is "
        "complete",
    )


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        load_config(tmp_path / "config.json")
    assert missing.value.errors == [
        "file not found: a package needs config.json at its top, next to skyhook_dir/"
    ]
    (tmp_path / "config.json").write_text('{"schema_version": "v1",\n "modes": }')
    with pytest.raises(ConfigError) as broken:
        load_config(tmp_path / "config.json")
    assert broken.value.errors == ["not valid JSON: Expecting value at line 2, column 11"]


@pytest.mark.parametrize(
    ("version", "valid"),
    [
        ("1.2.3", True),
        ("0.0.0", True),
        ("1.2.3-rc.1", True),
        ("1.2.3-alpha.beta+build.7", True),
        ("10.20.30+20130313144700", True),
        ("1.2", False),
        ("v1.2.3", False),
        ("01.2.3", False),
        ("1.2.3-01", False),
        ("1.2.3-", False),
        ("1.2.3+", False),
        ("1.2.3\n", False),
    ],
)
def test_package_version_is_a_full_semantic_version(version: str, valid: bool) -> None:
    assert bool(SEMVER.match(version)) is valid


@given(
    st.tuples(*(st.integers(min_value=0, max_value=10**6) for _ in range(3))),
    st.lists(st.from_regex(r"[1-9][0-9]{0,3}|[A-Za-z-][0-9A-Za-z-]{0,5}", fullmatch=True), max_size=3),
)
def test_semver_accepts_every_well_formed_version(core: tuple[int, int, int], prerelease: list[str]) -> None:
    version = ".".join(map(str, core)) + (f"-{'.'.join(prerelease)}" if prerelease else "")
    assert SEMVER.match(version)


@pytest.mark.parametrize(
    ("path", "check"),
    [
        ("apply.sh", "apply_check.sh"),
        ("apply", "apply_check"),
        ("sub/dir/run.py", "sub/dir/run_check.py"),
        ("a.b.sh", "a.b_check.sh"),
        (".hidden", ".hidden_check"),
    ],
)
def test_check_script_names_follow_the_reference_convention(path: str, check: str) -> None:
    assert check_script_name(path) == check
