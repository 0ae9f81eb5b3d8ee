"""Real nodes' pure parts: addresses, the egress proxy's resolution, the box's configuration, image names.

What keeps a box from touching the machine is checked here where it is a value: the kubelet's settings
(no kernel tunables written, no iptables chains, no DNS), containerd's registry configuration (no way out
to a real registry), the egress proxy's answer for every kind of target (no DNS, nothing outside the lab).
The boxes themselves run in e2e/test_real_nodes.py and e2e/test_real_node_sim.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from nodewright.sim import box, boxnet, registry
from nodewright.sim.boxnet import AddressPlan, Destination, resolve
from nodewright.sim.controlplane import fleet_labels, real_node_name, scheduler_config
from nodewright.sim.realnodes import _ending

PLAN = AddressPlan()
NETWORKS = [PLAN.lab_cidr, f"{PLAN.pod_cidr_prefix}.0.0/16"]


def test_the_address_plan() -> None:
    assert PLAN.gateway == "10.250.0.1"
    assert PLAN.service_ip == "10.96.0.1"
    assert PLAN.registry == "10.250.0.1:5000"
    assert [PLAN.node_ip(i) for i in (0, 1, 239)] == ["10.250.0.10", "10.250.0.11", "10.250.0.249"]
    assert PLAN.pod_subnet(3) == "10.251.3.0/24"
    with pytest.raises(ValueError, match="outside"):
        PLAN.node_ip(240)


def test_the_egress_proxy_resolves_nodes_pods_and_loopback_without_dns() -> None:
    names = {"real-node-0": "10.250.0.10"}
    assert resolve("real-node-0:10250", names=names, lab_networks=NETWORKS) == Destination(
        "10.250.0.10", 10250, True
    )
    assert resolve("10.251.0.7:9443", names=names, lab_networks=NETWORKS) == Destination(
        "10.251.0.7", 9443, True
    )
    assert resolve("localhost:31000", names=names, lab_networks=NETWORKS) == Destination(
        "127.0.0.1", 31000, False
    )
    assert resolve("[::1]:8080", names=names, lab_networks=NETWORKS) == Destination("::1", 8080, False)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("gpu-node-00001:10250", "no DNS lookups"),  # a kwok node's Hostname: never resolved
        ("example.com:443", "no DNS lookups"),
        ("192.0.2.53:53", "outside"),  # TEST-NET-1 (RFC 5737): never routed
        ("172.16.0.10:10250", "outside"),  # a kwok node's InternalIP
        ("real-node-0", "malformed"),
        (":443", "malformed"),
    ],
)
def test_the_egress_proxy_refuses_everything_else(target: str, why: str) -> None:
    # `resolve` is the proxy's pure decision: it dials nothing and looks nothing up, so these outside
    # addresses are only strings here, and the test is that they are refused.
    answer = resolve(target, names={"real-node-0": "10.250.0.10"}, lab_networks=NETWORKS)
    assert isinstance(answer, str) and why in answer, answer


@given(st.ip_addresses(v=4))
def test_no_address_outside_the_lab_or_loopback_is_ever_dialled(address: object) -> None:
    answer = resolve(f"{address}:443", names={}, lab_networks=NETWORKS)
    if isinstance(answer, Destination):
        import ipaddress

        ip = ipaddress.ip_address(answer.host)
        assert ip.is_loopback or any(ip in ipaddress.ip_network(n) for n in NETWORKS)
        assert answer.in_lab == (not ip.is_loopback)


def spec(tmp_path: Path) -> box.BoxesSpec:
    node = box.NodeSpec("real-node-0", 0, {"a": "b"})
    return box.BoxesSpec(
        dir=tmp_path, base=tmp_path / "base", sim_id="abc", api_port=1, registry_port=2, nodes=(node,)
    )


def test_the_kubelet_writes_nothing_of_the_machines(tmp_path: Path) -> None:
    config = box.kubelet_config(spec(tmp_path), box.NodeSpec("real-node-0", 0))
    assert config["protectKernelDefaults"] is True  # checks vm.overcommit_memory & co., never writes them
    assert config["makeIPTablesUtilChains"] is False
    assert config["resolvConf"] == "/etc/resolv.conf"  # the box's, without a name server
    assert config["cgroupRoot"] == "/nodewright.sim/abc/real-node-0"
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False
    assert config["readOnlyPort"] == 0 and config["healthzBindAddress"] == "127.0.0.1"
    assert config["authentication"]["anonymous"]["enabled"] is False


def test_containerd_pulls_every_image_from_the_simulators_registry_only() -> None:
    hosts = box.registry_hosts("10.250.0.1:5000")
    assert hosts.startswith('server = "http://10.250.0.1:5000"')  # no fallback to the image's real host
    assert hosts.count("http://") == 2 and "https" not in hosts
    config = box.containerd_config()
    assert 'config_path = "/etc/containerd/certs.d"' in config and "restrict_oom_score_adj = true" in config
    assert 'sandbox = "registry.k8s.io/pause:3.10"' in config


def test_the_layer_and_a_nodes_disk(tmp_path: Path) -> None:
    boxes = spec(tmp_path)
    box.write_layer(boxes.layer, plan=boxes.plan)
    etc = boxes.layer / "etc"
    assert "nameserver" not in (etc / "resolv.conf").read_text()
    assert (boxes.layer / "usr/bin/systemctl").readlink() == Path("/etc/nodewright-box/systemctl")
    assert (etc / "containerd/certs.d/_default/hosts.toml").exists()
    assert (etc / "nodewright-box/services.d/kubelet").stat().st_mode & 0o111
    cni = json.loads(box.cni_config("10.251.0.0/24"))
    bridge = cni["plugins"][0]
    assert bridge["ipMasq"] is False and bridge["ipam"]["ranges"] == [[{"subnet": "10.251.0.0/24"}]]


def test_labels_a_kubelet_may_set_on_its_node() -> None:
    labels = box.labels_for(fleet_labels(real_node_name(0), 0))
    assert labels["type"] == "real" and labels["sim.nodewright.io/real-node"] == "true"
    assert labels["nvidia.com/gpu.product"] and labels["topology.kubernetes.io/zone"] == "zone-a"
    assert "kubernetes.io/hostname" not in labels and "kubernetes.io/os" not in labels


def test_the_scheduler_keeps_pods_off_kwok_nodes(tmp_path: Path) -> None:
    config = yaml.safe_load(scheduler_config(tmp_path / "k"))
    (profile,) = config["profiles"]
    (plugin,) = profile["pluginConfig"]
    terms = plugin["args"]["addedAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}]


def test_the_egress_selector_configuration(tmp_path: Path) -> None:
    config = yaml.safe_load(boxnet.egress_selector_config(tmp_path / "egress.sock"))
    (selection,) = config["egressSelections"]
    assert selection["name"] == "cluster"
    assert selection["connection"] == {
        "proxyProtocol": "HTTPConnect",
        "transport": {"uds": {"udsName": str(tmp_path / "egress.sock")}},
    }


@pytest.mark.parametrize(
    ("code", "ending"),
    [
        (-signal.SIGHUP, "reboot"),
        (-signal.SIGINT, "poweroff"),
        (1, "crash (exit 1)"),
        (-signal.SIGKILL, "crash (signal SIGKILL)"),
    ],
)
def test_how_a_box_ended(code: int, ending: str) -> None:
    assert _ending(code) == ending


@pytest.mark.parametrize(
    ("reference", "host", "repository", "tag"),
    [
        ("busybox", "docker.io", "library/busybox", "latest"),
        ("ghcr.io/nodewright/agent:0.1.0", "ghcr.io", "nodewright/agent", "0.1.0"),
        ("localhost:5000/x", "localhost:5000", "x", "latest"),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io", "pause", "3.10"),
        ("nodewright/operator:1", "docker.io", "nodewright/operator", "1"),
    ],
)
def test_image_references(reference: str, host: str, repository: str, tag: str) -> None:
    assert registry.ImageRef.parse(reference) == registry.ImageRef(host, repository, tag)


def test_a_single_binary_image_layout(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF pause")
    layout = registry.binary_image_layout(
        binary, tmp_path / "layout", path="/pause", tag="3.10", user="65535:65535"
    )
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = index["manifests"]
    assert descriptor["annotations"]["org.opencontainers.image.ref.name"] == "3.10"
    manifest = json.loads((layout / "blobs/sha256" / descriptor["digest"].split(":")[1]).read_text())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_text())
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    again = registry.binary_image_layout(
        binary, tmp_path / "again", path="/pause", tag="3.10", user="65535:65535"
    )
    assert json.loads((again / "index.json").read_text()) == index  # reproducible
