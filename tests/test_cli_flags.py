"""Every flag of every `nodewright` command is checked at parse time: a bad value is one line on stderr
naming the flag, exit status 2, no traceback -- through the real `main()`. Good values still parse."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

import pytest
import structlog

from nodewright.cli import flags
from nodewright.cli.main import build_parser, main


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """`nodewright operator` configures logging onto the captured stderr; later tests must not write there."""
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers = []


BAD_INVOCATIONS: list[tuple[list[str], str]] = [
    # operator: numbers
    (["operator", "--qps=-5"], "--qps"),
    (["operator", "--qps=0"], "--qps"),
    (["operator", "--qps=nan"], "--qps"),
    (["operator", "--qps=fast"], "--qps"),
    (["operator", "--burst=0"], "--burst"),
    (["operator", "--burst=1.5"], "--burst"),
    (["operator", "--workers=0"], "--workers"),
    (["operator", "--node-workers=-1"], "--node-workers"),
    (["operator", "--event-qps=0"], "--event-qps"),
    (["operator", "--drain-timeout=-1"], "--drain-timeout"),
    (["operator", "--reboot-timeout=0"], "--reboot-timeout"),
    (["operator", "--resync-seconds=-1"], "--resync-seconds"),
    (["operator", "--resync-seconds=0"], "--resync-seconds"),
    (["operator", "--lease-duration=0.5"], "--lease-duration"),
    (["operator", "--renew-deadline=0"], "--renew-deadline"),
    (["operator", "--retry-period=-2"], "--retry-period"),
    (["operator", "--retry-period=inf"], "--retry-period"),
    # operator: addresses
    (["operator", "--health-probe-bind-address=garbage"], "--health-probe-bind-address"),
    (["operator", "--health-probe-bind-address=:99999"], "--health-probe-bind-address"),
    (["operator", "--health-probe-bind-address=::1:8081"], "--health-probe-bind-address"),
    (["operator", "--metrics-bind-address=host name:80"], "--metrics-bind-address"),
    (["operator", "--metrics-bind-address=:http"], "--metrics-bind-address"),
    # operator: names, images, taints, paths, choices
    (["operator", "--namespace=Bad_NS"], "--namespace"),
    (["operator", "--namespace=" + "n" * 64], "--namespace"),
    (["operator", "--lease-name=Not/A/Name"], "--lease-name"),
    (["operator", "--agent-image=BAD IMAGE"], "--agent-image"),
    (["operator", "--pause-image=registry.k8s.io/pause:"], "--pause-image"),
    (["operator", "--runtime-required-taint=key:Sometimes"], "--runtime-required-taint"),
    (["operator", "--runtime-required-taint=bad key=v:NoSchedule"], "--runtime-required-taint"),
    (["operator", "--runtime-required-taint=k=" + "v" * 64 + ":NoSchedule"], "--runtime-required-taint"),
    (["operator", "--copy-dir-root=relative/dir"], "--copy-dir-root"),
    (["operator", "--log-root=/var/../etc"], "--log-root"),
    (["operator", "--log-level=loud"], "--log-level"),
    (["operator", "--log-format=xml"], "--log-format"),
    (["operator", "--no-such-flag"], "--no-such-flag"),
    (["operator", "--leader-elect=maybe"], "--leader-elect"),
    (["operator", "--reapply-on-reboot=2"], "--reapply-on-reboot"),
    # webhook
    (["webhook", "--port=0"], "--port"),
    (["webhook", "--port=70000"], "--port"),
    (["webhook", "--bind-address="], "--bind-address"),
    (["webhook", "--bind-address=not an address"], "--bind-address"),
    (["webhook", "--namespace=UPPER"], "--namespace"),
    (["webhook", "--secret-name=-leading-dash"], "--secret-name"),
    (["webhook", "--service-name=1starts-with-digit"], "--service-name"),
    # sim
    (["sim"], "SIM_COMMAND"),
    (["sim", "up", "--nodes=-1"], "--nodes"),
    (["sim", "up", "--nodes=100000"], "--nodes"),
    (["sim", "up", "--profile=a100"], "--profile"),
    (["sim", "up", "--name-prefix=Gpu_Node"], "--name-prefix"),
    (["sim", "up", "--name-prefix=" + "a" * 58], "--name-prefix"),
    # demo
    (["demo", "--nodes=1"], "--nodes"),
    (["demo", "--canaries=-1"], "--canaries"),
    (["demo", "--timeout=0"], "--timeout"),
    (["demo", "--stall-minutes=-3"], "--stall-minutes"),
    # plan
    (["plan", "Not_A_Name"], "name"),
    (["plan", "-f", "/nonexistent/nodewright.yaml"], "--filename"),
    (["plan", "x", "--policy", "/nonexistent/policy.yaml"], "--policy"),
    (["plan", "x", "-o", "yaml"], "--output"),
]


@pytest.mark.parametrize(
    ("argv", "flag"), BAD_INVOCATIONS, ids=[" ".join(a)[:60] for a, _ in BAD_INVOCATIONS]
)
def test_bad_flag_is_one_line_naming_it(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0]
    assert "Traceback" not in err
    assert lines[0].startswith("nodewright")


@pytest.mark.parametrize(
    "argv",
    [
        ["operator", "--lease-duration=5", "--renew-deadline=10"],
        ["operator", "--lease-duration=15", "--renew-deadline=15"],
        ["operator", "--renew-deadline=2", "--retry-period=2"],
    ],
)
def test_lease_timings_must_nest(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "--renew-deadline" in err and "Traceback" not in err


def test_lease_timings_are_not_checked_without_leader_election(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # No Lease, nothing to nest: the next step (the kubeconfig) is what fails here.
    argv = ["operator", "--no-leader-elect", "--lease-duration=5", "--kubeconfig=/nonexistent/kubeconfig"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--renew-deadline" not in err and "/nonexistent/kubeconfig" in err


def test_plan_needs_a_name_or_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["nodewright plan: give either a NodeWright name or -f FILE"]


def test_good_values_parse_and_are_normalised() -> None:
    args = build_parser().parse_args(
        [
            "operator",
            "--qps=0.5",
            "--burst=1",
            "--workers=1",
            "--drain-timeout=0",
            "--health-probe-bind-address=",
            "--metrics-bind-address=[::1]:9090",
            "--namespace=team-a",
            "--lease-name=nodewright.operator",
            "--agent-image=registry.local:5000/team/agent@sha256:" + "a" * 64,
            "--runtime-required-taint=nodewright.io/runtime-required=true:NoSchedule",
            "--copy-dir-root=/var/lib/skyhook",
        ]
    )
    assert args.qps == 0.5 and args.burst == 1 and args.drain_timeout == 0.0
    assert args.health_probe_bind_address == "0"  # empty means disabled, said one way
    assert args.metrics_bind_address == "[::1]:9090"
    sim = build_parser().parse_args(["sim", "up", "--nodes=0", "--name-prefix=" + "a" * 57])
    assert sim.nodes == 0
    webhook = build_parser().parse_args(["webhook", "--bind-address=::", "--port=443"])
    assert webhook.bind_address == "::" and webhook.port == 443


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (":8081", True),
        ("0.0.0.0:0", True),
        ("localhost:8080", True),
        ("[fe80::1]:8080", True),
        ("0", True),
        ("8081", False),
        ("[::1]8080", False),
        ("1.2.3.4:", False),
        ("-bad-.example:80", False),
    ],
)
def test_bind_address(text: str, ok: bool) -> None:
    if ok:
        assert flags.bind_address(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            flags.bind_address(text)


def test_one_line_parser_error_names_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    parser = flags.OneLineParser(prog="tool")
    parser.add_argument("--n", type=flags.positive_int, required=True)
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert capsys.readouterr().err == (
        "tool: error: the following arguments are required: --n (see tool --help)\n"
    )


@pytest.mark.parametrize(
    ("argv", "leader_elect"),
    [
        ([], True),
        (["--leader-elect"], True),
        (["--leader-elect=true"], True),
        (["--leader-elect=false"], False),
        (["--leader-elect=False"], False),
        (["--no-leader-elect"], False),
        (["--no-leader-elect", "--leader-elect"], True),
    ],
)
def test_switches_take_go_flag_syntax(argv: list[str], leader_elect: bool) -> None:
    args = build_parser().parse_args(["operator", *argv, "--reapply-on-reboot=true"])
    assert args.leader_elect is leader_elect and args.reapply_on_reboot is True
    assert build_parser().parse_args(["operator"]).reapply_on_reboot is False


@pytest.mark.parametrize(
    ("argv", "chained"),
    [
        ([], True),  # the faster mode is the default (issue 33; CHANGELOG.md)
        (["--chain-packages"], True),
        (["--no-chain-packages"], False),
        (["--chain-packages=false"], False),
    ],
)
def test_chained_runs_are_on_by_default_and_can_be_turned_off(argv: list[str], chained: bool) -> None:
    assert build_parser().parse_args(["operator", *argv]).chain_packages is chained


# The Helm chart's container args are parsed by tests/test_helm_chart.py, from the chart as a real helm
# renders it.


def test_fail_collapses_multiline_messages(capsys: pytest.CaptureFixture[str]) -> None:
    assert flags.fail("nodewright x", "first line\n  second\tline") == 2
    assert capsys.readouterr().err == "nodewright x: first line second line\n"
