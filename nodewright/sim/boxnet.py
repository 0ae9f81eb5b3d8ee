"""The real nodes' network: a lab namespace of their own, joined to the machine only by forwarders we run.

The real nodes must reach the API server and the registry, the API server must reach their kubelets and
pods (logs, exec, the webhook Service's endpoints), and nothing may change the machine's own network:
no address, link, route or firewall rule in its namespace, and no packet to any other address. So:

- A **lab** network namespace, created by the `realnodes` process (`nodewright.sim.netns`), holds a bridge
  (`nwlab0`, the gateway address) and, on its loopback, the in-cluster address of the `kubernetes`
  Service (the first address of the service range, 10.96.0.1). Each node's own namespace is joined to
  the bridge by a veth pair; its pod subnet is routed through its address. The lab has no way out: no
  link leaves it, so a packet to any other address is dropped there.
- **Forwarders** accept TCP connections inside the lab and open the matching connection to 127.0.0.1 on
  the machine: `kubernetes` Service address:443 -> kube-apiserver (kubelets and in-cluster clients such as
  the operator's pod use it, as on a real cluster where a kube-proxy rule does the same), and gateway:5000
  -> the local registry (containerd's pulls).
- The API server's own traffic to nodes and pods (its `cluster` egress: kubelet API, Service endpoints of
  webhooks) goes through an HTTP CONNECT proxy on a Unix socket (`--egress-selector-config-file`), which
  dials inside the lab. It resolves a node name from the table of real nodes it was given and never
  asks DNS: an unknown name is refused, so the API server's habit of dialing a node by its Hostname sends
  no query off the machine. `localhost` is dialled on the machine's loopback (the simulated kubelet's
  pods answer there through kwok).

Addresses (`AddressPlan`): lab 10.250.0.0/24 with the gateway .1 and node i at .(10 + i); node i's pods
in 10.251.i.0/24; the `kubernetes` Service at the first address of 10.96.0.0/16.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodewright.sim import netns

log = logging.getLogger("nodewright.sim.boxnet")

LAB_BRIDGE: Final = "nwlab0"
SERVICE_CIDR: Final = "10.96.0.0/16"
_CONNECT_TIMEOUT_S: Final = 10.0
_HEADER_TIMEOUT_S: Final = 10.0
_IP_TIMEOUT_S: Final = 15.0
_BUFFER: Final = 64 * 1024
MAX_NODES: Final = 240


@dataclass(frozen=True)
class AddressPlan:
    """Where everything lives in the lab network (module docstring)."""

    lab_cidr: str = "10.250.0.0/24"
    pod_cidr_prefix: str = "10.251"
    service_cidr: str = SERVICE_CIDR
    registry_port: int = 5000

    @property
    def gateway(self) -> str:
        return str(ipaddress.ip_network(self.lab_cidr)[1])

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.lab_cidr).prefixlen

    @property
    def service_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def registry(self) -> str:
        return f"{self.gateway}:{self.registry_port}"

    def node_ip(self, index: int) -> str:
        if not 0 <= index < MAX_NODES:
            raise ValueError(f"real node index {index} outside 0..{MAX_NODES - 1}")
        return str(ipaddress.ip_network(self.lab_cidr)[10 + index])

    def pod_subnet(self, index: int) -> str:
        return f"{self.pod_cidr_prefix}.{index}.0/24"


def run_ip(*args: str, namespace: str | None = None) -> None:
    """`ip ARGS` (iproute2), inside the namespace at path `namespace` when given (via nsenter)."""
    argv = ["ip", *args] if namespace is None else ["nsenter", f"--net={namespace}", "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.returncode}")


class Lab:
    """The lab namespace: created empty, then given its bridge, addresses and the nodes' links."""

    def __init__(self, plan: AddressPlan) -> None:
        self.plan = plan
        self.fd = netns.new_namespace()
        self.path = netns.path(self.fd)
        ns = self.path
        run_ip("link", "set", "lo", "up", namespace=ns)
        run_ip("addr", "add", f"{plan.service_ip}/32", "dev", "lo", namespace=ns)
        run_ip("link", "add", LAB_BRIDGE, "type", "bridge", namespace=ns)
        run_ip("addr", "add", f"{plan.gateway}/{plan.prefix_length}", "dev", LAB_BRIDGE, namespace=ns)
        run_ip("link", "set", LAB_BRIDGE, "up", namespace=ns)
        # Pods of one node reach pods and kubelets of the others through the lab: it routes between
        # the nodes' links (a per-namespace switch; the machine's own ip_forward is another file).
        with netns.inside(self.fd):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n", encoding="ascii")

    def attach(self, *, index: int, box_pid: int) -> None:
        """Join the namespace of the box process `box_pid` (node `index`) to the lab and route its pods.
        A rebooted box has a new namespace: the old link died with the old one, so this runs per boot."""
        plan, lab, link = self.plan, self.path, f"nwn{index}"
        box = f"/proc/{box_pid}/ns/net"
        with contextlib.suppress(OSError):
            run_ip("link", "del", link, namespace=lab)  # a leftover of the previous boot, if any
        run_ip(
            "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", str(box_pid), namespace=lab
        )
        run_ip("link", "set", link, "master", LAB_BRIDGE, "up", namespace=lab)
        run_ip("link", "set", "lo", "up", namespace=box)
        run_ip("addr", "add", f"{plan.node_ip(index)}/{plan.prefix_length}", "dev", "eth0", namespace=box)
        run_ip("link", "set", "eth0", "up", namespace=box)
        run_ip("route", "add", "default", "via", plan.gateway, namespace=box)
        run_ip("route", "replace", plan.pod_subnet(index), "via", plan.node_ip(index), namespace=lab)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# ----------------------------------------------------------------------------------------------------
# Byte pumps


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_BUFFER):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Copy both ways until both directions ended, then close both connections."""
    try:
        await asyncio.gather(_pump(a[0], b[1]), _pump(b[0], a[1]))
    finally:
        for _, writer in (a, b):
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def open_host(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to 127.0.0.1:`port` in the machine's namespace (where this process lives)."""
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), _CONNECT_TIMEOUT_S)


async def open_in(namespace: int, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `host:port` from inside `namespace`."""
    sock = netns.tcp_socket(namespace)
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, (host, port)), _CONNECT_TIMEOUT_S
        )
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def forward(namespace: int, *, address: str, port: int, target_port: int) -> asyncio.Server:
    """Listen on `address:port` inside `namespace`; each connection is spliced to 127.0.0.1:`target_port`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await open_host(target_port)
        except (TimeoutError, OSError) as err:
            log.warning("forward %s:%d -> 127.0.0.1:%d failed: %s", address, port, target_port, err)
            writer.close()
            return
        await splice((reader, writer), upstream)

    sock = netns.tcp_socket(namespace)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(256)
    return await asyncio.start_server(handle, sock=sock)


# ----------------------------------------------------------------------------------------------------
# The API server's egress proxy


@dataclass(frozen=True)
class Destination:
    """Where a CONNECT target is dialled: inside the lab, or on the machine's loopback."""

    host: str
    port: int
    in_lab: bool


def resolve(target: str, *, names: Mapping[str, str], lab_networks: Sequence[str]) -> Destination | str:
    """The destination of `CONNECT target`, or the reason it is refused. Names come only from `names`
    (the real nodes) and `localhost`; an address must lie in the lab's networks or be loopback."""
    host, sep, port_text = target.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        return f"malformed CONNECT target {target!r}"
    port, host = int(port_text), host.strip("[]")
    if host == "localhost":
        return Destination("127.0.0.1", port, in_lab=False)
    address = names.get(host, host)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{host!r} is not a real node of this simulator (no DNS lookups are made)"
    if ip.is_loopback:
        return Destination(str(ip), port, in_lab=False)
    if any(ip in ipaddress.ip_network(net) for net in lab_networks):
        return Destination(str(ip), port, in_lab=True)
    return f"{ip} is outside the real nodes' networks"


class ConnectProxy:
    """HTTP CONNECT over a Unix socket, as kube-apiserver's egress selector speaks it (HTTPConnect/uds)."""

    def __init__(self, lab: Lab, *, names: Mapping[str, str], lab_networks: Sequence[str]) -> None:
        self.lab = lab
        self.names = dict(names)
        self.lab_networks = list(lab_networks)

    async def serve(self, socket_path: Path) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        server = await asyncio.start_unix_server(self._handle, path=str(socket_path))
        os.chmod(socket_path, 0o600)  # kube-apiserver runs as root here; nobody else needs it
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEADER_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        request = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(request) != 3 or request[0] != "CONNECT":
            await self._refuse(writer, 405, f"only CONNECT is served, not {' '.join(request)[:80]!r}")
            return
        where = resolve(request[1], names=self.names, lab_networks=self.lab_networks)
        if isinstance(where, str):
            await self._refuse(writer, 403, where)
            return
        try:
            upstream = await (
                open_in(self.lab.fd, where.host, where.port) if where.in_lab else open_host(where.port)
            )
        except (TimeoutError, OSError) as err:
            await self._refuse(writer, 502, f"dialing {request[1]} failed: {err}")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await splice((reader, writer), upstream)

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, code: int, reason: str) -> None:
        log.warning("egress proxy refused: %s", reason)
        with contextlib.suppress(OSError):
            writer.write(f"HTTP/1.1 {code} Refused\r\nContent-Length: 0\r\n\r\n".encode())
            await writer.drain()
        writer.close()


def egress_selector_config(socket_path: Path) -> str:
    """kube-apiserver's `--egress-selector-config-file`: its traffic to nodes and pods via our proxy."""
    return (
        "apiVersion: apiserver.k8s.io/v1beta1\n"
        "kind: EgressSelectorConfiguration\n"
        "egressSelections:\n"
        "- name: cluster\n"
        "  connection:\n"
        "    proxyProtocol: HTTPConnect\n"
        "    transport:\n"
        "      uds:\n"
        f"        udsName: {socket_path}\n"
    )
