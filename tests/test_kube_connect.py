"""Kubeconfig parity, over real connections: every field kubectl honours for connecting, honoured here.

Each test loads a kubeconfig with `nodewright.kube.config.load_kubeconfig` and makes a real request with
`KubeClient` to a TLS server on 127.0.0.1 that reports what it saw (the Authorization header, the client
certificate, the SNI name), through a small HTTP proxy on 127.0.0.1 where the kubeconfig says so:

- `certificate-authority-data` verifies the server; another CA does not;
- `tls-server-name` is sent as SNI and checked against the certificate instead of the URL's host;
- `insecure-skip-tls-verify` connects to a server no CA vouches for (with a CA it is refused, as kubectl
  refuses it);
- `exec` plugins: bearer token, client certificate, `provideClusterInfo`, a fresh token after a 401,
  the apiVersion check and `installHint`;
- `proxy-url` (HTTPS through CONNECT, with Proxy-Authorization; plain HTTP in absolute form, as the
  `kubectl nodewright` plugin uses it), the proxy environment with NO_PROXY and loopback exemptions;
- `$KUBECONFIG` with several files merged as kubectl merges them; `tokenFile` over `token`; basic auth.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nodewright.kube.client import KubeClient
from nodewright.kube.config import (
    BasicAuth,
    ConfigError,
    ExecCredential,
    TokenFile,
    load_kubeconfig,
    parse_proxy,
    proxy_from_environment,
)
from nodewright.kube.resources import ApiError
from tests.kubefake import NODES_C, FakeKube, node

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------------
# Certificates


@dataclass
class Issued:
    cert: bytes
    key: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class CA:
    name: str
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    def __post_init__(self) -> None:
        self.cert = self._sign(self.name, self.key.public_key(), ca=True, sans=[], usage=None)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def _sign(
        self,
        subject: str,
        public_key: ec.EllipticCurvePublicKey,
        *,
        ca: bool,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier | None,
    ) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def server(self, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        cert = self._sign(
            "server", key.public_key(), ca=False, sans=sans, usage=ExtendedKeyUsageOID.SERVER_AUTH
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def client(self, user: str) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._sign(user, key.public_key(), ca=False, sans=[], usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----------------------------------------------------------------------------------------------------
# A TLS "API server" that reports what it saw


@dataclass
class Seen:
    authorization: list[str | None] = field(default_factory=list)
    client_cn: list[str | None] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)
    refuse_tokens: set[str] = field(default_factory=set)


@contextlib.asynccontextmanager
async def tls_server(issued: Issued, *, client_ca: CA | None, tmp: Path) -> AsyncIterator[tuple[int, Seen]]:
    seen = Seen()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    (tmp / "srv.crt").write_bytes(issued.cert)
    (tmp / "srv.key").write_bytes(issued.key)
    context.load_cert_chain(tmp / "srv.crt", tmp / "srv.key")
    if client_ca is not None:
        context.load_verify_locations(cadata=client_ca.pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL

    def sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        seen.sni.append(name)

    context.sni_callback = sni

    async def version(request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization")
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        cn = None
        for rdn in (peer or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        seen.authorization.append(authorization)
        seen.client_cn.append(cn)
        if authorization and authorization.removeprefix("Bearer ") in seen.refuse_tokens:
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        return web.json_response({"gitVersion": "v1.36.0"})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


# ----------------------------------------------------------------------------------------------------
# A small HTTP proxy: CONNECT tunnels, and plain HTTP requests in absolute form


@dataclass
class ProxyLog:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, target, auth


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def http_proxy(upstream_port: int) -> AsyncIterator[tuple[int, ProxyLog]]:
    """Every connection goes to 127.0.0.1:`upstream_port`, whatever target the client named: the
    kubeconfig's server is a port where nothing listens, so only a request through the proxy arrives."""
    log = ProxyLog()
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
        log.requests.append((method, target, headers.get("proxy-authorization")))
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            up_writer.write(head)  # absolute-form request line: HTTP servers accept it as is
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], log
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def closed_port() -> int:
    """A port where nothing listens (connecting there directly is refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------------------------
# Kubeconfigs


def kubeconfig(path: Path, cluster: JSON, user: JSON | None = None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user or {}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


async def get_version(path: Path, **client: Any) -> JSON:
    async with KubeClient(load_kubeconfig(path), max_retries=0, timeout=10, **client) as kube:
        return await kube.request("GET", "/version", resource="version")


@pytest.fixture(scope="module")
def ca() -> CA:
    return CA("nodewright-test-ca")


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "KUBECONFIG",
    ):
        monkeypatch.delenv(name, raising=False)


# ----------------------------------------------------------------------------------------------------
# TLS fields


async def test_certificate_authority_data_verifies_the_server(tmp_path: Path, ca: CA) -> None:
    async with tls_server(ca.server(ips=("127.0.0.1",)), client_ca=None, tmp=tmp_path) as (port, _seen):
        server = f"https://127.0.0.1:{port}"
        good = kubeconfig(tmp_path / "good", {"server": server, "certificate-authority-data": b64(ca.pem)})
        assert await get_version(good) == {"gitVersion": "v1.36.0"}
        other = CA("someone-else")
        bad = kubeconfig(tmp_path / "bad", {"server": server, "certificate-authority-data": b64(other.pem)})
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get_version(bad)
        file = tmp_path / "ca.crt"
        file.write_bytes(ca.pem)
        by_file = kubeconfig(tmp_path / "file", {"server": server, "certificate-authority": "ca.crt"})
        assert await get_version(by_file) == {"gitVersion": "v1.36.0"}


async def test_tls_server_name_is_sent_as_sni_and_checked_against_the_certificate(
    tmp_path: Path, ca: CA
) -> None:
    # The certificate names the API server, not the address it is reached at (a tunnel, an IP).
    issued = ca.server(dns=("api.cluster.internal",))
    async with tls_server(issued, client_ca=None, tmp=tmp_path) as (port, seen):
        cluster = {"server": f"https://127.0.0.1:{port}", "certificate-authority-data": b64(ca.pem)}
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get_version(kubeconfig(tmp_path / "plain", cluster))
        named = kubeconfig(tmp_path / "named", {**cluster, "tls-server-name": "api.cluster.internal"})
        assert await get_version(named) == {"gitVersion": "v1.36.0"}
        assert seen.sni[-1] == "api.cluster.internal"
        wrong = kubeconfig(tmp_path / "wrong", {**cluster, "tls-server-name": "other.internal"})
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get_version(wrong)


async def test_insecure_skip_tls_verify_connects_without_verification(tmp_path: Path) -> None:
    stranger = CA("self-signed-somewhere")
    async with tls_server(stranger.server(dns=("x.invalid",)), client_ca=None, tmp=tmp_path) as (port, _):
        server = f"https://127.0.0.1:{port}"
        insecure = kubeconfig(tmp_path / "k", {"server": server, "insecure-skip-tls-verify": True})
        assert await get_version(insecure) == {"gitVersion": "v1.36.0"}
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get_version(kubeconfig(tmp_path / "strict", {"server": server}))
    both = {
        "server": "https://h",
        "insecure-skip-tls-verify": True,
        "certificate-authority-data": b64(stranger.pem),
    }
    with pytest.raises(ConfigError, match="insecure-skip-tls-verify with a certificate-authority"):
        load_kubeconfig(kubeconfig(tmp_path / "both", both))
    with pytest.raises(ConfigError, match="insecure-skip-tls-verify must be true or false"):
        load_kubeconfig(
            kubeconfig(tmp_path / "typo", {"server": "https://h", "insecure-skip-tls-verify": "yes"})
        )


# ----------------------------------------------------------------------------------------------------
# exec credential plugins


def exec_plugin(tmp_path: Path, *, status: str, api_version: str = "client.authentication.k8s.io/v1") -> JSON:
    """A plugin script: counts its runs, saves KUBERNETES_EXEC_INFO, prints an ExecCredential whose
    status is the Python expression `status` (it may use `n`, the run number)."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, os, pathlib\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "p = d / 'runs'\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "(d / 'exec-info.json').write_text(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "(d / 'exec-env').write_text(os.environ.get('PLUGIN_REGION', ''))\n"
        f"print(json.dumps({{'apiVersion': {api_version!r}, 'kind': 'ExecCredential',"
        f" 'status': {status}}}))\n"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "env": [{"name": "PLUGIN_REGION", "value": "eu-1"}],
            "interactiveMode": "Never",
            "provideClusterInfo": True,
        }
    }


async def test_exec_plugin_token_client_certificate_and_cluster_info(tmp_path: Path, ca: CA) -> None:
    client = ca.client("exec-user")
    pair = {"clientCertificateData": client.cert.decode(), "clientKeyData": client.key.decode()}
    status = f"dict(token='tok' + str(n), **{pair!r})"
    async with tls_server(ca.server(ips=("127.0.0.1",)), client_ca=ca, tmp=tmp_path) as (port, seen):
        server = f"https://127.0.0.1:{port}"
        path = kubeconfig(
            tmp_path / "k",
            {"server": server, "certificate-authority-data": b64(ca.pem)},
            exec_plugin(tmp_path, status=status),
        )
        assert await get_version(path) == {"gitVersion": "v1.36.0"}
        assert seen.authorization[-1] == "Bearer tok1"
        assert seen.client_cn[-1] == "exec-user", "the plugin's client certificate was presented"
    info = json.loads((tmp_path / "exec-info.json").read_text())
    assert info["apiVersion"] == "client.authentication.k8s.io/v1" and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == server
    assert base64.b64decode(info["spec"]["cluster"]["certificate-authority-data"]) == ca.pem
    assert (tmp_path / "exec-env").read_text() == "eu-1"


async def test_a_token_refused_with_401_runs_the_plugin_again_once(tmp_path: Path, ca: CA) -> None:
    far = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = f"{{'token': 'tok' + str(n), 'expirationTimestamp': {far!r}}}"
    async with tls_server(ca.server(ips=("127.0.0.1",)), client_ca=None, tmp=tmp_path) as (port, seen):
        seen.refuse_tokens.add("tok1")  # revoked before its expiry
        path = kubeconfig(
            tmp_path / "k",
            {"server": f"https://127.0.0.1:{port}", "certificate-authority-data": b64(ca.pem)},
            exec_plugin(tmp_path, status=status),
        )
        assert await get_version(path) == {"gitVersion": "v1.36.0"}
        assert seen.authorization == ["Bearer tok1", "Bearer tok2"]
        seen.refuse_tokens |= {"tok3", "tok4"}  # a fresh load runs the plugin again: tok3, then tok4
        with pytest.raises(ApiError) as refused:
            await get_version(path)
        assert refused.value.status == 401, "a second refusal is the answer, not a loop"
    assert (tmp_path / "runs").read_text() == "4"


async def test_exec_plugin_mistakes_are_one_line_config_errors(tmp_path: Path) -> None:
    older = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": {}}
    wrong = ExecCredential(
        command=sys.executable,
        args=["-c", "import json; print(json.dumps(" + repr(older) + "))"],
        interactive_mode="Never",
    )
    with pytest.raises(ConfigError, match=r"configured for client\.authentication\.k8s\.io/v1 but returned"):
        await wrong.authorization()
    missing = ExecCredential(
        command=str(tmp_path / "aws-iam-authenticator"), install_hint="brew install\n aws-iam-authenticator"
    )
    with pytest.raises(ConfigError, match=r"cannot run: .*; brew install aws-iam-authenticator$"):
        await missing.authorization()
    always = ExecCredential(
        command=sys.executable, interactive_mode="Always", stdin_is_terminal=lambda: False
    )
    with pytest.raises(ConfigError, match="interactiveMode Always and needs a terminal"):
        await always.authorization()
    failing = ExecCredential(
        command=sys.executable,
        args=["-c", "import sys; sys.stderr.write('token expired\\nrun login\\n'); sys.exit(3)"],
        interactive_mode="Never",
    )
    with pytest.raises(ConfigError, match=r"failed \(exit 3\): token expired run login$"):
        await failing.authorization()
    doc = {"exec": {"command": "x", "interactiveMode": "Sometimes"}}
    with pytest.raises(ConfigError, match="interactiveMode 'Sometimes' is not one of"):
        load_kubeconfig(kubeconfig(tmp_path / "k", {"server": "https://h"}, doc))


# ----------------------------------------------------------------------------------------------------
# Proxies


async def test_proxy_url_tunnels_https_with_proxy_authorization(tmp_path: Path, ca: CA) -> None:
    server = tls_server(ca.server(ips=("127.0.0.1",)), client_ca=None, tmp=tmp_path)
    async with server as (port, seen), http_proxy(port) as (proxy_port, log):
        target = f"127.0.0.1:{closed_port()}"
        cluster = {
            "server": f"https://{target}",
            "certificate-authority-data": b64(ca.pem),
            "proxy-url": f"http://sre:s%40cret@127.0.0.1:{proxy_port}",
        }
        path = kubeconfig(tmp_path / "k", cluster, {"token": "t0k"})
        assert await get_version(path) == {"gitVersion": "v1.36.0"}
    assert log.requests == [("CONNECT", target, f"Basic {b64(b'sre:s@cret')}")]
    assert seen.authorization == ["Bearer t0k"], "the bearer token travels inside the tunnel"


async def test_the_plugin_uses_the_kubeconfig_proxy(tmp_path: Path) -> None:
    """The SRE's report: kubectl used the proxy, `kubectl nodewright` connected directly and failed."""
    kube = await FakeKube().start()
    kube.put(NODES_C, node("n1"))
    try:
        port = int(kube.url.rsplit(":", 1)[1])
        async with http_proxy(port) as (proxy_port, log):
            direct = f"http://127.0.0.1:{closed_port()}"
            path = kubeconfig(
                tmp_path / "k", {"server": direct, "proxy-url": f"127.0.0.1:{proxy_port}"}, {"token": "t"}
            )
            env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "KUBECONFIG"}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nodewright", "node", "list", "--kubeconfig", str(path), "-o", "json",
                cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            async with asyncio.timeout(60):
                _out, err = await proc.communicate()
    finally:
        await kube.stop()
    assert proc.returncode == 0, err.decode()
    assert log.requests and all(target.startswith(f"{direct}/") for _m, target, _a in log.requests), (
        log.requests
    )


def test_proxy_urls_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match="SOCKS proxies are not supported"):
        parse_proxy("socks5://127.0.0.1:1080", origin="proxy-url")
    with pytest.raises(ConfigError, match="is not an http:// or https:// URL"):
        parse_proxy("ftp://p", origin="proxy-url")
    assert parse_proxy("proxy.corp:3128", origin="x").url == "http://proxy.corp:3128"
    assert parse_proxy("https://u:p@[fd00::1]:8443", origin="x") == parse_proxy(
        "https://u:p@[fd00::1]:8443", origin="x"
    )
    assert parse_proxy("https://u:p@[fd00::1]:8443", origin="x").url == "https://[fd00::1]:8443"


@pytest.mark.parametrize(
    ("server", "environ", "expected"),
    [
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        ("https://api.corp:6443", {"https_proxy": "p:3128"}, "http://p:3128"),
        ("https://api.corp:6443", {"HTTP_PROXY": "http://p:3128"}, None),  # http proxy is for http servers
        ("http://api.corp:8080", {"HTTP_PROXY": "http://p:3128"}, "http://p:3128"),
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "corp"}, None),
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": ".corp"}, None),
        ("https://corp:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": ".corp"}, "http://p"),
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p", "no_proxy": "other, api.corp:6443"}, None),
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "api.corp:443"}, "http://p"),
        ("https://api.corp:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "*"}, None),
        ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "10.0.0.0/8"}, None),
        ("https://[fd00::5]:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "fd00::/8"}, None),
        ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "10.1.2.4"}, "http://p"),
        ("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://p"}, None),  # loopback: never proxied
        ("https://localhost:6443", {"HTTPS_PROXY": "http://p"}, None),
        ("https://[::1]:6443", {"HTTPS_PROXY": "http://p"}, None),
    ],
)
def test_the_proxy_environment_as_kubectl_reads_it(
    server: str, environ: dict[str, str], expected: str | None
) -> None:
    found = proxy_from_environment(server, environ)
    assert (found.url if found else None) == expected


def test_proxy_url_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    from_env = load_kubeconfig(kubeconfig(tmp_path / "a", {"server": "https://api.corp"}))
    assert from_env.proxy is not None and from_env.proxy.url == "http://env-proxy:3128"
    assert from_env.proxy.origin == "$HTTPS_PROXY"
    configured = {"server": "https://api.corp", "proxy-url": "http://kc-proxy:8080"}
    assert load_kubeconfig(kubeconfig(tmp_path / "b", configured)).proxy.url == "http://kc-proxy:8080"  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------------
# Files and users


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    (second / "ca.crt").write_bytes(ca.pem)
    (first / "config").write_text(
        yaml.safe_dump(
            {
                "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "sre"}}],
                "users": [{"name": "sre", "user": {"token": "first-wins"}}],
            }
        )
    )
    (second / "config").write_text(
        yaml.safe_dump(
            {
                "current-context": "prod",
                "clusters": [
                    {
                        "name": "prod",
                        "cluster": {"server": "https://10.0.0.1", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [{"name": "sre", "user": {"token": "second-loses"}}],
                "contexts": [{"name": "prod", "context": {"cluster": "nope", "user": "nope"}}],
            }
        )
    )
    missing = tmp_path / "missing"
    monkeypatch.setenv(
        "KUBECONFIG", os.pathsep.join([str(missing), str(first / "config"), str(second / "config")])
    )
    config = load_kubeconfig()
    assert config.server == "https://10.0.0.1"
    assert asyncio.run(config.auth.authorization()) == "Bearer first-wins"
    assert config.ssl_context is not None, "the CA path resolved against the second file's directory"
    assert str(first / "config") in config.source and str(second / "config") in config.source


def test_token_file_wins_over_token_and_basic_auth_is_sent(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    both = load_kubeconfig(
        kubeconfig(tmp_path / "a", {"server": "https://h"}, {"token": "t", "tokenFile": "token"})
    )
    assert isinstance(both.auth, TokenFile)
    assert asyncio.run(both.auth.authorization()) == "Bearer from-file"
    basic = load_kubeconfig(
        kubeconfig(tmp_path / "b", {"server": "https://h"}, {"username": "admin", "password": "pw"})
    )
    assert isinstance(basic.auth, BasicAuth)
    assert asyncio.run(basic.auth.authorization()) == f"Basic {b64(b'admin:pw')}"
    provider = {"auth-provider": {"name": "gcp", "config": {}}}
    with pytest.raises(ConfigError, match=r"auth-provider 'gcp' is not supported.*gke-gcloud-auth-plugin"):
        load_kubeconfig(kubeconfig(tmp_path / "c", {"server": "https://h"}, provider))
