"""The agent's environment: reference SKYHOOK_* names, their NODEWRIGHT_* equivalents, clear errors."""

from __future__ import annotations

import pytest

from nodewright.agent.settings import (
    SettingsError,
    mirrored_names,
    parse_boolean,
    parse_resource_id,
    read_settings,
)


def test_defaults_are_the_reference_agents() -> None:
    settings = read_settings({}, is_root=True)
    assert (settings.root_dir, settings.log_dir, settings.data_dir) == (
        "/etc/skyhook",
        "/var/log/skyhook",
        "/skyhook-package",
    )
    assert settings.resource_id is None
    assert settings.write_logs and settings.copy_resolv and not settings.always_run_steps
    assert settings.buffer_limit == 8192 and settings.stop_timeout == 10.0
    assert settings.log_limit == 2 * 1024 * 1024


def test_chroot_defaults_to_whether_the_agent_is_root() -> None:
    assert read_settings({}, is_root=True).chroot is True
    assert read_settings({}, is_root=False).chroot is False
    assert read_settings({"NODEWRIGHT_AGENT_CHROOT": "false"}, is_root=True).chroot is False


def test_chroot_requested_without_root_is_an_error() -> None:
    with pytest.raises(SettingsError) as caught:
        read_settings({"NODEWRIGHT_AGENT_CHROOT": "true"}, is_root=False)
    assert caught.value.errors == [
        "NODEWRIGHT_AGENT_CHROOT=true needs root (chroot is a privileged call): run the agent as root or set "
        "NODEWRIGHT_AGENT_CHROOT=false to run steps without chroot"
    ]


def test_nodewright_names_win_over_skyhook_names() -> None:
    env = {
        "SKYHOOK_ROOT_DIR": "/etc/skyhook-x",
        "NODEWRIGHT_ROOT_DIR": "/etc/nodewright",
        "SKYHOOK_LOG_DIR": "/var/log/sk",
        "SKYHOOK_RESOURCE_ID": "nw-u-1_p_1.0.0",
        "SKYHOOK_AGENT_WRITE_LOGS": "False",
        "NODEWRIGHT_AGENT_BUFFER_LIMIT": "16",
        "SKYHOOK_AGENT_BUFFER_LIMIT": "32",
        "OVERLAY_ALWAYS_RUN_STEP": "TRUE",
        "COPY_RESOLV": "0",
        "NODEWRIGHT_AGENT_STOP_TIMEOUT": "2.5",
    }
    settings = read_settings(env, is_root=True)
    assert settings.root_dir == "/etc/nodewright" and settings.log_dir == "/var/log/sk"
    assert settings.resource_id == "nw-u-1_p_1.0.0"
    assert not settings.write_logs and settings.always_run_steps and not settings.copy_resolv
    assert settings.buffer_limit == 16 and settings.stop_timeout == 2.5


def test_directories_are_normalised_absolute_host_paths() -> None:
    assert read_settings({"SKYHOOK_ROOT_DIR": "//etc//skyhook/./"}, is_root=True).root_dir == "/etc/skyhook"


def test_every_bad_value_is_reported_with_its_variable() -> None:
    env = {
        "SKYHOOK_ROOT_DIR": "etc/skyhook",
        "NODEWRIGHT_LOG_DIR": "/var/../log",
        "SKYHOOK_AGENT_WRITE_LOGS": "maybe",
        "SKYHOOK_AGENT_BUFFER_LIMIT": "8KiB",
        "NODEWRIGHT_AGENT_LOG_LIMIT": "1000",
        "NODEWRIGHT_AGENT_STOP_TIMEOUT": "-1",
    }
    with pytest.raises(SettingsError) as caught:
        read_settings(env, is_root=True)
    assert caught.value.errors == [
        "SKYHOOK_ROOT_DIR='etc/skyhook': expected an absolute path on the host without '..'",
        "NODEWRIGHT_LOG_DIR='/var/../log': expected an absolute path on the host without '..'",
        "SKYHOOK_AGENT_WRITE_LOGS='maybe': expected true or false",
        "SKYHOOK_AGENT_BUFFER_LIMIT='8KiB': expected a whole number of bytes from 1 to 1048576",
        "NODEWRIGHT_AGENT_LOG_LIMIT='1000': expected a whole number of bytes from 65536 to 1073741824",
        "NODEWRIGHT_AGENT_STOP_TIMEOUT='-1': expected a number of seconds greater than 0 and at most 3600",
    ]


OUT_OF_RANGE = {
    # 99999999999999999999 once passed and crashed the first step (os.read: int too large for C ssize_t).
    "NODEWRIGHT_AGENT_BUFFER_LIMIT": ["99999999999999999999", "1048577", "0", "-1", "1_000", "1e3", "0x10",
                                      "\u0663", "4.5", "+5", "1 024"],
    "SKYHOOK_AGENT_BUFFER_LIMIT": ["99999999999999999999", "0"],
    "NODEWRIGHT_AGENT_LOG_LIMIT": ["99999999999999999999", "1073741825", "65535", "0", "-1", "2MiB",
                                   "1_000_000"],
    "NODEWRIGHT_AGENT_STOP_TIMEOUT": ["0", "-1", "nan", "inf", "1e400", "1e3", "3600.5", "1e-3", "1_0",
                                      "--1"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in OUT_OF_RANGE.items() for value in values]
)
def test_numbers_out_of_range_or_not_plain_decimals_are_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        read_settings({name: value}, is_root=True)
    (error,) = caught.value.errors
    assert error.startswith(f"{name}={value!r}: expected a ")


def test_numbers_at_the_ends_of_their_ranges_are_accepted() -> None:
    low = read_settings(
        {
            "NODEWRIGHT_AGENT_BUFFER_LIMIT": "1",
            "NODEWRIGHT_AGENT_LOG_LIMIT": "65536",
            "NODEWRIGHT_AGENT_STOP_TIMEOUT": ".5",
        },
        is_root=True,
    )
    assert (low.buffer_limit, low.log_limit, low.stop_timeout) == (1, 65536, 0.5)
    high = read_settings(
        {
            "NODEWRIGHT_AGENT_BUFFER_LIMIT": " 1048576 ",
            "NODEWRIGHT_AGENT_LOG_LIMIT": "1073741824",
            "NODEWRIGHT_AGENT_STOP_TIMEOUT": "3600",
        },
        is_root=True,
    )
    assert (high.buffer_limit, high.log_limit, high.stop_timeout) == (1048576, 1 << 30, 3600.0)


def test_booleans() -> None:
    assert [parse_boolean(v) for v in ("true", "Yes", "1", "false", "NO", "0", "", "on")] == [
        True,
        True,
        True,
        False,
        False,
        False,
        None,
        None,
    ]


def test_resource_id_names_package_and_version() -> None:
    resource = parse_resource_id("customer-f5a1d42e-74e5-1_tuning_2.0.2")
    assert (resource.package, resource.version) == ("tuning", "2.0.2")
    assert parse_resource_id("a-u-1_my_pkg_1.0.0").package == "my_pkg"
    for bad in ("", "nounderscore", "a_b", "_pkg_1.0.0", "a_pkg_"):
        with pytest.raises(ValueError, match="is not <nodewright>-<uid>-<generation>_<package>_<version>"):
            parse_resource_id(bad)


def test_each_skyhook_variable_has_its_nodewright_twin() -> None:
    assert mirrored_names(
        {
            "SKYHOOK_DIR": "/d",
            "NODEWRIGHT_RESOURCE_ID": "r",
            "SKYHOOK_NODE_ORDER": "3",
            "NODEWRIGHT_NODE_ORDER": "3",
        }
    ) == {"NODEWRIGHT_DIR": "/d", "SKYHOOK_RESOURCE_ID": "r"}
