"""Connection settings: kubeconfig files and in-cluster service-account config, read as kubectl reads them.

Why our own loader: importing anything from kubernetes_asyncio (even only `config`) loads its whole
generated client, about 78 MiB of resident memory -- most of the operator's budget. What the operator
needs is small: a base URL, an `ssl.SSLContext`, an `Authorization` header and, for some networks, a
proxy. The rule for this module is parity with kubectl: a kubeconfig that works with kubectl connects
the same way here, field by field; a setting we cannot honour is a `ConfigError`, never ignored.

Kubeconfig (`load_kubeconfig`):

- Files: `--kubeconfig` alone when given; else every file of `$KUBECONFIG` (colon-separated) merged as
  kubectl merges them -- the first file to define a cluster, user or context of a given name wins, the
  first non-empty `current-context` wins, files that do not exist are skipped; else `~/.kube/config`.
  Relative paths resolve against the directory of the file that holds the entry.
- The `current-context` (or `--context`) selects a cluster and a user.
- Cluster: `server` (http or https), `certificate-authority-data` (base64, wins over) /
  `certificate-authority` (a file), `insecure-skip-tls-verify` (no verification at all; with a CA it is
  refused, as kubectl refuses it), `tls-server-name` (the name sent in SNI and checked against the
  server's certificate instead of the URL's host: for API servers reached through an IP, a tunnel or a
  load balancer), `proxy-url` (an `http://` or `https://` proxy, with `user:password@` sent as
  Proxy-Authorization; HTTPS to the API server goes through a CONNECT tunnel; `socks5://` is refused
  with the way out).
- Without `proxy-url`, the proxy environment applies as in kubectl (Go's ProxyFromEnvironment):
  `HTTPS_PROXY`/`https_proxy` for an https server, `HTTP_PROXY`/`http_proxy` for http, unless
  `NO_PROXY`/`no_proxy` lists the host (a name matches itself and its subdomains, `.name` only
  subdomains, `*` everything, IP addresses and CIDR ranges, optionally with a port). `localhost` and
  loopback addresses never go through a proxy.
- User (`nodewright.kube.credentials`): `client-certificate(-data)` + `client-key(-data)` (mutual TLS,
  loaded into the SSL context from memory by `load_pem_chain`: no temporary directory needed), then
  `tokenFile` (wins over `token`, as in client-go), `token`, `username`/`password`, or an `exec`
  credential plugin (client.authentication.k8s.io v1/v1beta1, with `env`, `interactiveMode`,
  `installHint` and `provideClusterInfo`). `auth-provider` is refused: kubectl dropped its providers
  (use the exec plugin that replaced yours, e.g. `gke-gcloud-auth-plugin`, `kubelogin`).

In-cluster (`load_incluster`): `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, the CA and token
mounted at `/var/run/secrets/kubernetes.io/serviceaccount` (a `TokenFile`: re-read for rotation). No
proxy: the API server's Service address is inside the cluster.

Everything is checked at load time, because a bad file is a configuration error, not an outage: every
problem (unreadable file, YAML that is not a kubeconfig, a server URL without http(s), base64 that does
not decode, a CA, client certificate or key that OpenSSL refuses, a key that does not match its
certificate, a proxy URL that cannot work) raises `ConfigError` with a one-line message naming the file,
the entry and the field. `ClusterConfig.source` names where the settings came from, for later messages
("the API server rejected the credentials of ...").
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.credentials import (
    EXEC_API_VERSIONS,
    INTERACTIVE_MODES,
    TEMP_DIR_REMEDY,
    Auth,
    BasicAuth,
    ConfigError,
    ExecCredential,
    NoAuth,
    NoTempDir,
    StaticToken,
    TokenFile,
    load_client_pair,
    load_pem_chain,
    no_temp_dir_message,
    temp_dir_missing,
)

__all__ = [
    "TEMP_DIR_REMEDY",
    "Auth",
    "BasicAuth",
    "ClusterConfig",
    "ConfigError",
    "ExecCredential",
    "NoAuth",
    "NoTempDir",
    "Proxy",
    "StaticToken",
    "TokenFile",
    "load_config",
    "load_incluster",
    "load_kubeconfig",
    "load_pem_chain",
    "no_temp_dir_message",
    "parse_proxy",
    "proxy_from_environment",
    "temp_dir_missing",
]

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PROXY_SCHEMES: Final = ("http", "https")
EXEC_EXTENSION: Final = "client.authentication.k8s.io/exec"


@dataclass(frozen=True)
class Proxy:
    """An HTTP(S) proxy: its URL without credentials, and the Proxy-Authorization they make."""

    url: str
    authorization: str | None = None
    origin: str = ""
    """Where it was configured: `proxy-url` of a kubeconfig cluster, or an environment variable."""


@dataclass
class ClusterConfig:
    server: str
    ssl_context: ssl.SSLContext | None
    auth: Auth
    tls_server_name: str | None = None
    namespace: str | None = None
    source: str = ""
    """Where these settings came from (`kubeconfig <path> (context <name>)`, `in-cluster service account`)."""
    proxy: Proxy | None = None


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------------------------------
# Kubeconfig files, merged as kubectl merges them


@dataclass
class _Entry:
    body: dict[str, Any]
    file: Path

    @property
    def base(self) -> Path:
        return self.file.parent


@dataclass
class _Merged:
    """Clusters, users and contexts by name (the first file to define a name wins)."""

    files: list[Path]
    current_context: str | None = None
    entries: dict[str, dict[str, _Entry]] = field(
        default_factory=lambda: {"cluster": {}, "user": {}, "context": {}}
    )

    def add(self, file: Path, doc: dict[str, Any]) -> None:
        if not self.current_context and doc.get("current-context"):
            self.current_context = str(doc["current-context"])
        for kind, named in self.entries.items():
            listed = doc.get(f"{kind}s")
            for entry in listed if isinstance(listed, list) else []:
                if isinstance(entry, dict) and "name" in entry and str(entry["name"]) not in named:
                    body = entry.get(kind)
                    named[str(entry["name"])] = _Entry(body if isinstance(body, dict) else {}, file)

    def named(self, kind: str, name: str) -> _Entry:
        found = self.entries[kind].get(name)
        if found is None:
            raise ConfigError(f"{self.describe()}: no {kind} named {name!r} in {kind}s")
        return found

    def describe(self) -> str:
        return f"kubeconfig {os.pathsep.join(str(f) for f in self.files)}"


def _read_kubeconfig(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"kubeconfig {file} is not valid YAML: {_one_line(exc)}") from None
    doc = _json_document(text)
    if doc is _NOT_JSON:
        doc = _yaml_document(file, text)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {file} is not a kubeconfig (expected a mapping with clusters, users)")
    return doc


_NOT_JSON: Final = object()


def _json_document(text: str) -> Any:
    """The document if `text` is JSON (a YAML subset: kubectl reads both), else `_NOT_JSON`. JSON is
    parsed without PyYAML: an operator given a JSON kubeconfig (the benchmark's) then imports none of
    its 1.4 MiB, as in a cluster. A flow mapping that is YAML but not JSON falls back to PyYAML."""
    if not text.lstrip().startswith("{"):
        return _NOT_JSON
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def _yaml_document(file: Path, text: str) -> Any:
    # Imported here: an operator in a cluster reads no kubeconfig, and PyYAML is 1.4 MiB of its memory.
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {file} is not valid YAML: {_one_line(exc)}") from None


def kubeconfig_files(path: str | Path | None) -> list[Path]:
    """The files to read: `path`; else `$KUBECONFIG`'s existing entries (all of them missing: the first,
    so the error names it); else `~/.kube/config`."""
    if path is not None:
        return [Path(path).expanduser()]
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not listed:
        return [Path.home() / ".kube" / "config"]
    return [p for p in listed if p.exists()] or listed[:1]


def _merged(path: str | Path | None) -> _Merged:
    files = kubeconfig_files(path)
    merged = _Merged(files)
    for file in files:
        merged.add(file, _read_kubeconfig(file))
    return merged


# ----------------------------------------------------------------------------------------------------
# Fields


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _pem(section: dict[str, Any], key: str, base: Path, where: str) -> bytes | None:
    """PEM bytes from `<key>-data` (base64) or `<key>` (a file path); `where` names the entry."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode("".join(str(data).split()), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: {key}-data is not valid base64") from None
    path = section.get(key)
    if path:
        file = _resolve(base, str(path))
        try:
            return file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: {key} {file}: cannot read: {exc.strerror or exc}") from None
    return None


def _flag(section: dict[str, Any], key: str, where: str) -> bool:
    value = section.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")


def _ssl_context(
    *,
    ca: bytes | None,
    cert: bytes | None,
    key: bytes | None,
    insecure: bool,
    ca_field: str = "certificate-authority",
    cert_field: str = "client-certificate/client-key",
) -> ssl.SSLContext:
    """A client TLS context; `ca_field`/`cert_field` name the settings in errors."""
    try:
        context = ssl.create_default_context(cadata=ca.decode("ascii") if ca else None)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"{ca_field} is not a PEM CA certificate ({_one_line(exc)}); fix or regenerate it"
        ) from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert and key:
        load_client_pair(context, cert, key, what=cert_field)
    elif cert or key:
        missing = "client-key" if cert else "client-certificate"
        raise ConfigError(f"{cert_field}: {missing} is missing (mutual TLS needs both)")
    return context


def _server_url(value: Any, where: str) -> str:
    server = str(value or "").rstrip("/")
    if not server:
        raise ConfigError(f"{where}: no server")
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: server {server!r} is not an http(s):// URL with a host")
    return server


def parse_proxy(value: str, *, origin: str) -> Proxy:
    """A proxy URL as kubectl takes it (no scheme means http); `origin` names the setting in errors."""
    text = value.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{origin} {value!r} is not a URL: {exc}") from None
    if parts.scheme.startswith("socks"):
        raise ConfigError(
            f"{origin} {value!r}: SOCKS proxies are not supported; use the HTTP CONNECT port of the proxy,"
            " or a local tunnel (e.g. ssh -L) and its address as the server"
        )
    if parts.scheme not in PROXY_SCHEMES or not parts.hostname:
        raise ConfigError(f"{origin} {value!r} is not an http:// or https:// URL with a host")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    url = f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = f"Basic {base64.b64encode(pair).decode()}"
    return Proxy(url, authorization, origin)


def _no_proxy_matches(entry: str, host: str, port: int) -> bool:
    """One NO_PROXY entry against a host and port, as Go's httpproxy matches them."""
    entry = entry.strip().lower()
    if not entry:
        return False
    if entry == "*":
        return True
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass
    name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    if entry_port and entry_port != str(port):
        return False
    if name.startswith("*."):
        name = name[1:]
    if name.startswith("."):
        return host.endswith(name)
    return host == name or host.endswith(f".{name}")


def proxy_from_environment(server: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy the environment gives for `server` (module docstring), or None to connect directly."""
    parts = urlsplit(server)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    names = ("HTTPS_PROXY", "https_proxy") if parts.scheme == "https" else ("HTTP_PROXY", "http_proxy")
    name = next((n for n in names if environ.get(n)), None)
    if name is None:
        return None
    no_proxy = environ.get("NO_PROXY") or environ.get("no_proxy") or ""
    if any(_no_proxy_matches(entry, host, port) for entry in no_proxy.split(",")):
        return None
    return parse_proxy(environ[name], origin=f"${name}")


def _cluster_proxy(cluster: dict[str, Any], server: str, where: str) -> Proxy | None:
    configured = cluster.get("proxy-url")
    if configured:
        return parse_proxy(str(configured), origin=f"{where}: proxy-url")
    return proxy_from_environment(server, os.environ)


# ----------------------------------------------------------------------------------------------------
# Loading


def load_kubeconfig(path: str | Path | None = None, *, context: str | None = None) -> ClusterConfig:
    """Load a kubeconfig (`path`, else `$KUBECONFIG`'s files merged, else `~/.kube/config`)."""
    merged = _merged(path)
    context_name = context or merged.current_context
    if not context_name:
        raise ConfigError(f"{merged.describe()} has no current-context")
    ctx = merged.named("context", context_name).body
    cluster_name, user_name = str(ctx.get("cluster")), ctx.get("user")
    cluster = merged.named("cluster", cluster_name)
    where_cluster = f"kubeconfig {cluster.file}: cluster {cluster_name!r}"
    server = _server_url(cluster.body.get("server"), where_cluster)
    user = merged.named("user", str(user_name)) if user_name else _Entry({}, cluster.file)
    where_user = f"kubeconfig {user.file}: user {user_name!r}"
    insecure = _flag(cluster.body, "insecure-skip-tls-verify", where_cluster)
    ca = _pem(cluster.body, "certificate-authority", cluster.base, where_cluster)
    if insecure and ca:
        raise ConfigError(
            f"{where_cluster}: insecure-skip-tls-verify with a certificate-authority: kubectl refuses the"
            " pair too; remove one (the CA, to verify the server)"
        )
    auth, cert, key = _user_auth(user.body, user.base, where_user)
    ssl_context = None
    if server.startswith("https://"):
        ssl_context = _ssl_context(
            ca=ca,
            cert=cert,
            key=key,
            insecure=insecure,
            ca_field=f"{where_cluster}: certificate-authority",
            cert_field=f"{where_user}: client-certificate/client-key",
        )
    tls_server_name = cluster.body.get("tls-server-name")
    if isinstance(auth, ExecCredential):
        auth.ssl_context = ssl_context
        if _flag(user.body.get("exec") or {}, "provideClusterInfo", where_user):
            auth.cluster = _exec_cluster_info(cluster.body, server, ca, insecure, cluster_name)
    return ClusterConfig(
        server=server,
        ssl_context=ssl_context,
        auth=auth,
        tls_server_name=str(tls_server_name) if tls_server_name else None,
        namespace=ctx.get("namespace"),
        source=f"{merged.describe()} (context {context_name})",
        proxy=_cluster_proxy(cluster.body, server, where_cluster),
    )


def _exec_cluster_info(
    cluster: dict[str, Any], server: str, ca: bytes | None, insecure: bool, name: str
) -> dict[str, Any]:
    """`spec.cluster` of KUBERNETES_EXEC_INFO (client.authentication.k8s.io Cluster)."""
    info: dict[str, Any] = {"server": server, "insecure-skip-tls-verify": insecure}
    if ca:
        info["certificate-authority-data"] = base64.b64encode(ca).decode()
    for key in ("tls-server-name", "proxy-url", "disable-compression"):
        if cluster.get(key):
            info[key] = cluster[key]
    for extension in cluster.get("extensions") or []:
        if isinstance(extension, dict) and extension.get("name") == EXEC_EXTENSION:
            info["config"] = extension.get("extension")
    return info


def _user_auth(user: dict[str, Any], base: Path, where: str) -> tuple[Auth, bytes | None, bytes | None]:
    cert = _pem(user, "client-certificate", base, where)
    key = _pem(user, "client-key", base, where)
    if user.get("auth-provider"):
        provider = (user.get("auth-provider") or {}).get("name", "?")
        raise ConfigError(
            f"{where}: auth-provider {provider!r} is not supported (kubectl dropped its auth providers);"
            " use the exec credential plugin that replaced it, e.g. kubelogin or gke-gcloud-auth-plugin"
        )
    if user.get("tokenFile"):
        return TokenFile(_resolve(base, str(user["tokenFile"]))), cert, key
    if user.get("token"):
        return StaticToken(str(user["token"])), cert, key
    if user.get("username"):
        return BasicAuth(str(user["username"]), str(user.get("password") or "")), cert, key
    exec_spec = user.get("exec")
    if isinstance(exec_spec, dict):
        return _exec_plugin(exec_spec, where), cert, key
    return NoAuth(), cert, key


def _exec_plugin(spec: dict[str, Any], where: str) -> ExecCredential:
    if not spec.get("command"):
        raise ConfigError(f"{where}: exec has no command")
    env_entries = spec.get("env") or []
    if not isinstance(env_entries, list) or not all(
        isinstance(e, dict) and "name" in e and "value" in e for e in env_entries
    ):
        raise ConfigError(f"{where}: exec.env must be a list of {{name, value}}")
    api_version = str(spec.get("apiVersion") or EXEC_API_VERSIONS[0])
    if api_version not in EXEC_API_VERSIONS:
        raise ConfigError(
            f"{where}: exec.apiVersion {api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}"
        )
    mode = str(spec.get("interactiveMode") or "IfAvailable")
    if mode not in INTERACTIVE_MODES:
        raise ConfigError(
            f"{where}: exec.interactiveMode {mode!r} is not one of {', '.join(INTERACTIVE_MODES)}"
        )
    return ExecCredential(
        command=str(spec["command"]),
        args=[str(a) for a in spec.get("args") or []],
        env={str(e["name"]): str(e["value"]) for e in env_entries},
        api_version=api_version,
        interactive_mode=mode,
        install_hint=str(spec.get("installHint") or ""),
    )


def load_incluster(*, directory: Path = SERVICE_ACCOUNT_DIR, clock: Clock = SYSTEM_CLOCK) -> ClusterConfig:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token = directory / "token"
    if not token.exists():
        raise ConfigError(f"service-account token {token} not found (is automountServiceAccountToken off?)")
    try:
        namespace_file = directory / "namespace"
        namespace = namespace_file.read_text().strip() if namespace_file.exists() else None
        ca = (directory / "ca.crt").read_bytes()
    except OSError as exc:
        raise ConfigError(f"service account in {directory}: {exc.filename}: {exc.strerror or exc}") from None
    return ClusterConfig(
        server=f"https://{host}:{port}",
        ssl_context=_ssl_context(
            ca=ca, cert=None, key=None, insecure=False, ca_field=f"service-account CA {directory / 'ca.crt'}"
        ),
        auth=TokenFile(token, clock=clock),
        namespace=namespace,
        source=f"in-cluster service account ({directory})",
    )


def load_config(kubeconfig: str | Path | None = None) -> ClusterConfig:
    """A kubeconfig when given (or `$KUBECONFIG` is set), otherwise the in-cluster config."""
    if kubeconfig is not None or os.environ.get("KUBECONFIG"):
        return load_kubeconfig(kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return load_incluster()
    return load_kubeconfig(None)
