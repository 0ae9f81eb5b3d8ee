"""The interrupt mode: payload decoding, the commands per type, once per resource id, unprivileged safety.

Host commands (`reboot`, `systemctl`) are only ever run chrooted; their success and failure handling is
covered by the chroot tests (test_agent_chroot.py). Here the agent runs unprivileged, where it must
record the commands instead of running them on the test machine.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from nodewright.agent.cli import UsageError, parse_invocation
from nodewright.agent.interrupts import Interrupt, InterruptError, decode, encode
from tests.agent_fixtures.hostroot import RESOURCE_ID, HostRoot


def _payload(body: object) -> str:
    return base64.b64encode(json.dumps(body).encode()).decode()


@pytest.mark.parametrize(
    ("body", "commands"),
    [
        ({"type": "node_restart"}, [("reboot",)]),
        (
            {"type": "service_restart", "services": ["containerd", "kubelet"]},
            [
                ("systemctl", "daemon-reload"),
                ("systemctl", "restart", "containerd"),
                ("systemctl", "restart", "kubelet"),
            ],
        ),
        ({"type": "restart_all_services"}, [("service", "procps", "force-reload")]),
        ({"type": "no_op"}, []),
        ({"type": "script_interrupt"}, []),
    ],
)
def test_each_interrupt_type_runs_the_reference_commands(
    body: dict[str, object], commands: list[tuple[str, ...]]
) -> None:
    interrupt = decode(_payload(body))
    assert interrupt.commands() == commands
    assert decode(encode(interrupt)) == interrupt


def test_the_operators_payload_decodes() -> None:
    # What nodewright.plan.interrupts.agent_payload builds for a service interrupt.
    payload = base64.b64encode(
        json.dumps({"services": ["a.service"], "type": "service_restart"}, sort_keys=True).encode()
    )
    assert decode(payload.decode()) == Interrupt(type="service_restart", services=("a.service",))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not base64!", "is not base64 of JSON"),
        (base64.b64encode(b"[1]").decode(), "is not base64 of JSON"),
        (_payload({"kind": "reboot"}), "is not base64 of JSON"),
        (_payload({"type": "reboot"}), "unknown interrupt type 'reboot'; known types: node_restart"),
        (_payload({"type": "service_restart"}), "needs 'services': a non-empty list of unit names"),
        (_payload({"type": "service_restart", "services": [""]}), "needs 'services'"),
    ],
)
def test_bad_payloads_are_explained(payload: str, message: str) -> None:
    with pytest.raises(InterruptError, match=message):
        decode(payload)


def test_fields_other_types_do_not_use_are_ignored_and_named() -> None:
    interrupt = decode(_payload({"type": "node_restart", "services": ["x"], "delay": 3}))
    assert interrupt.ignored_fields == ("delay", "services")


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    host = HostRoot(root=tmp_path / "root")
    host.package_dir.mkdir(parents=True)
    return host


def test_unprivileged_interrupts_are_recorded_not_run_and_run_once(host: HostRoot) -> None:
    payload = encode(Interrupt(type="service_restart", services=("kubelet",)))
    result = host.run("interrupt", payload)
    assert result.code == 0, result.text
    assert "recorded in" in result.out and "not run" in result.out
    flags = host.state_dir / "interrupts" / "flags" / RESOURCE_ID
    assert sorted(p.name for p in flags.iterdir()) == [
        "service_restart_0.complete",
        "service_restart_1.complete",
    ]
    lines = (host.state_dir / "interrupts" / "requested.jsonl").read_text().splitlines()
    assert [json.loads(line)["command"] for line in lines] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "restart", "kubelet"],
    ]
    assert {json.loads(line)["resource_id"] for line in lines} == {RESOURCE_ID}
    again = host.run("interrupt", payload)
    assert again.code == 0 and again.out.count("already ran for") == 2
    assert len((host.state_dir / "interrupts" / "requested.jsonl").read_text().splitlines()) == 2


def test_a_new_resource_id_runs_the_interrupt_again(host: HostRoot) -> None:
    payload = encode(Interrupt(type="node_restart"))
    assert host.run("interrupt", payload).code == 0
    assert host.run("interrupt", payload, env=host.env(SKYHOOK_RESOURCE_ID="nw-uid-2_demo_1.0.0")).code == 0
    lines = (host.state_dir / "interrupts" / "requested.jsonl").read_text().splitlines()
    assert [json.loads(line)["resource_id"] for line in lines] == [RESOURCE_ID, "nw-uid-2_demo_1.0.0"]


def test_no_op_only_writes_its_flag(host: HostRoot) -> None:
    assert host.run("interrupt", encode(Interrupt(type="no_op"))).code == 0
    flag = host.state_dir / "interrupts" / "flags" / RESOURCE_ID / "no_op.complete"
    assert float(flag.read_text()) > 0
    assert not (host.state_dir / "interrupts" / "requested.jsonl").exists()


def test_interrupt_mode_needs_a_resource_id_and_a_payload(host: HostRoot) -> None:
    env = host.env()
    del env["SKYHOOK_RESOURCE_ID"]
    result = host.run("interrupt", encode(Interrupt(type="node_restart")), env=env)
    assert (
        result.code == 1
        and "resource id '' is not <nodewright>-<uid>-<generation>_<package>_<version>" in result.err
    )
    with pytest.raises(UsageError, match="the interrupt mode needs the interrupt"):
        parse_invocation(["interrupt", "/var/lib/skyhook/x"])
    result = host.run("interrupt", "garbage")
    assert result.code == 1 and "is not base64 of JSON" in result.err


def test_interrupt_mode_does_not_need_the_package_directory(host: HostRoot, tmp_path: Path) -> None:
    other = HostRoot(root=host.root, copy_dir="/var/lib/skyhook/nw/gone")
    result = other.run(
        "interrupt", encode(Interrupt(type="no_op")), env=other.env(SKYHOOK_DATA_DIR=str(tmp_path / "none"))
    )
    assert result.code == 0, result.text
