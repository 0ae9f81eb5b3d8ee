"""Connection settings: kubeconfig files and in-cluster service-account config.

Why our own loader: importing anything from kubernetes_asyncio (even only `config`) loads its whole
generated client, about 78 MiB of resident memory — most of the operator's budget. What the operator
needs is small: a base URL, an `ssl.SSLContext` and an `Authorization` header.

Kubeconfig (`load_kubeconfig`): the `current-context` (or a named one) selects a cluster and a user.
Cluster: `server`, `certificate-authority` / `certificate-authority-data`, `insecure-skip-tls-verify`,
`tls-server-name`. User: `client-certificate(-data)` + `client-key(-data)` (mutual TLS, loaded into the
SSL context from memory by `load_pem_chain`: no temporary directory needed), `token`, `tokenFile`, or an
`exec` credential plugin (client.authentication.k8s.io ExecCredential; the token is cached until its
`expirationTimestamp`, certificates returned by the plugin are loaded once). Relative file paths resolve
against the kubeconfig's directory, as kubectl does.

In-cluster (`load_incluster`): `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, the CA and token
mounted at `/var/run/secrets/kubernetes.io/serviceaccount`. Bound service-account tokens are projected
and rotated by the kubelet (hourly by default, valid longer), so the token file is re-read at most once a
minute rather than cached for the life of the process.

Everything is checked at load time, because a bad file is a configuration error, not an outage: every
problem (unreadable file, YAML that is not a kubeconfig, a server URL without http(s), base64 that does
not decode, a CA, client certificate or key that OpenSSL refuses, a key that does not match its
certificate) raises `ConfigError` with a one-line message naming the file, the entry and the field.
`ClusterConfig.source` names where the settings came from, for later messages ("the API server
rejected the credentials of ...").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import json
import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from nodewright.kube.clock import SYSTEM_CLOCK, Clock

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_SECONDS = 60.0
EXEC_TIMEOUT_SECONDS = 30.0


class ConfigError(Exception):
    pass


class Auth(Protocol):
    async def authorization(self) -> str | None:
        """The value of the Authorization header (or None for certificate-only auth)."""
        ...


class NoAuth:
    async def authorization(self) -> str | None:
        return None


@dataclass
class StaticToken:
    token: str

    async def authorization(self) -> str | None:
        return f"Bearer {self.token}"


@dataclass
class TokenFile:
    """A token read from a file and re-read every `refresh` seconds (projected SA token rotation)."""

    path: Path
    refresh: float = TOKEN_REFRESH_SECONDS
    clock: Clock = SYSTEM_CLOCK
    _token: str = ""
    _read_at: float | None = None

    async def authorization(self) -> str | None:
        now = self.clock.monotonic()
        if self._read_at is None or now - self._read_at >= self.refresh:
            try:
                self._token = self.path.read_text().strip()
            except OSError as exc:
                if not self._token:
                    raise ConfigError(f"cannot read token file {self.path}: {exc}") from exc
                # Keep the previous token: a transient read error must not log the operator out.
            self._read_at = now
        return f"Bearer {self._token}"


@dataclass
class ExecCredential:
    """The `users[].user.exec` plugin: run a command, use `status.token` until it expires."""

    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_version: str = "client.authentication.k8s.io/v1"
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    _token: str | None = None
    _expires: dt.datetime | None = None

    async def authorization(self) -> str | None:
        if self._token is None or (self._expires is not None and self.now() >= self._expires):
            status = await self.run()
            self._token = status.get("token")
            expiry = status.get("expirationTimestamp")
            self._expires = _parse_time(expiry) - dt.timedelta(seconds=10) if expiry else None
        return f"Bearer {self._token}" if self._token else None

    async def run(self) -> dict[str, Any]:
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command,
                *self.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ConfigError(f"exec plugin {self.command}: cannot run: {exc.strerror or exc}") from None
        try:
            async with asyncio.timeout(EXEC_TIMEOUT_SECONDS):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ConfigError(f"exec plugin {self.command} timed out") from None
        if proc.returncode != 0:
            detail = _one_line(err.decode(errors="replace"))[:500]
            raise ConfigError(f"exec plugin {self.command} failed (exit {proc.returncode}): {detail}")
        try:
            credential = json.loads(out)
        except ValueError:
            raise ConfigError(f"exec plugin {self.command} printed no ExecCredential JSON") from None
        status = credential.get("status") if isinstance(credential, dict) else None
        if not isinstance(status, dict):
            raise ConfigError(f"exec plugin {self.command} returned no status")
        return status


@dataclass
class ClusterConfig:
    server: str
    ssl_context: ssl.SSLContext | None
    auth: Auth
    tls_server_name: str | None = None
    namespace: str | None = None
    source: str = ""
    """Where these settings came from (`kubeconfig <path> (context <name>)`, `in-cluster service account`)."""


def _parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _named(entries: Any, name: str, kind: str, where: str) -> dict[str, Any]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            return body if isinstance(body, dict) else {}
    raise ConfigError(f"{where}: no {kind} named {name!r} in {kind}s")


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


class NoTempDir(OSError):
    """Neither an in-memory file nor a writable temporary directory is available for a PEM pair."""


TEMP_DIR_REMEDY = (
    "mount a writable directory at /tmp (the Helm chart mounts an emptyDir there) or point $TMPDIR at one"
)


def no_temp_dir_message(exc: BaseException) -> str:
    """One line for a process that found no usable temporary directory (`tempfile`'s error)."""
    return f"no writable temporary directory ({_one_line(exc)}): {TEMP_DIR_REMEDY}"


def temp_dir_missing() -> OSError | None:
    """tempfile's error when no temporary directory is usable ($TMPDIR, /tmp, /var/tmp, ...), else None."""
    try:
        tempfile.gettempdir()
    except OSError as exc:
        return exc
    return None


def load_pem_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a PEM certificate (chain) and its private key from memory into `context`.

    `ssl` loads them only from files. On Linux they go into anonymous in-memory files (`memfd_create`,
    opened by OpenSSL through /proc/self/fd), so the key never touches a disk and a read-only root file
    system without /tmp is fine; elsewhere into a private temporary directory, removed at once, and
    `NoTempDir` says so when there is none. `ssl.SSLError`/`ValueError` mean the pair is not PEM or the
    key does not match.
    """
    fds = _memory_files(cert, key)
    if fds:
        try:
            context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    try:
        tmp = tempfile.TemporaryDirectory(prefix="nodewright-tls-")
    except OSError as exc:
        raise NoTempDir(no_temp_dir_message(exc)) from None
    with tmp:
        cert_path, key_path = Path(tmp.name) / "tls.crt", Path(tmp.name) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)


def _memory_files(*contents: bytes) -> list[int]:
    """File descriptors of in-memory files holding `contents` (empty where the system has none)."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is None or not Path("/proc/self/fd").is_dir():
        return []
    fds: list[int] = []
    try:
        for data in contents:
            fds.append(memfd("nodewright-tls", os.MFD_CLOEXEC))
            with open(fds[-1], "wb", closefd=False) as file:
                file.write(data)
    except OSError:  # e.g. a seccomp profile that refuses memfd_create
        for fd in fds:
            os.close(fd)
        return []
    return fds


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
        try:
            load_pem_chain(context, cert, key)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"{cert_field}: not a PEM certificate and its matching private key ({_one_line(exc)})"
            ) from None
        except NoTempDir as exc:
            raise ConfigError(f"{cert_field}: {exc}") from None
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


def load_kubeconfig(path: str | Path | None = None, *, context: str | None = None) -> ClusterConfig:
    """Load a kubeconfig (`path`, else `$KUBECONFIG`'s first entry, else `~/.kube/config`)."""
    if path is None:
        env = os.environ.get("KUBECONFIG", "")
        path = env.split(os.pathsep)[0] if env else Path.home() / ".kube" / "config"
    file = Path(path).expanduser()
    # Imported here: an operator in a cluster reads no kubeconfig, and PyYAML is 1.4 MiB of its memory.
    import yaml

    try:
        doc = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {file}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"kubeconfig {file} is not valid YAML: {_one_line(exc)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {file} is not a kubeconfig (expected a mapping with clusters, users)")
    base = file.parent
    context_name = context or doc.get("current-context")
    if not context_name:
        raise ConfigError(f"kubeconfig {file} has no current-context")
    ctx = _named(doc.get("contexts"), str(context_name), "context", f"kubeconfig {file}")
    cluster_name, user_name = str(ctx.get("cluster")), ctx.get("user")
    where_cluster = f"kubeconfig {file}: cluster {cluster_name!r}"
    where_user = f"kubeconfig {file}: user {user_name!r}"
    cluster = _named(doc.get("clusters"), cluster_name, "cluster", f"kubeconfig {file}")
    user = _named(doc.get("users"), str(user_name), "user", f"kubeconfig {file}") if user_name else {}
    server = _server_url(cluster.get("server"), where_cluster)
    auth, cert, key = _user_auth(user, base, where_user)
    ssl_context = None
    if server.startswith("https://"):
        ssl_context = _ssl_context(
            ca=_pem(cluster, "certificate-authority", base, where_cluster),
            cert=cert,
            key=key,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            ca_field=f"{where_cluster}: certificate-authority",
            cert_field=f"{where_user}: client-certificate/client-key",
        )
    return ClusterConfig(
        server=server,
        ssl_context=ssl_context,
        auth=auth,
        tls_server_name=cluster.get("tls-server-name"),
        namespace=ctx.get("namespace"),
        source=f"kubeconfig {file} (context {context_name})",
    )


def _user_auth(user: dict[str, Any], base: Path, where: str) -> tuple[Auth, bytes | None, bytes | None]:
    cert = _pem(user, "client-certificate", base, where)
    key = _pem(user, "client-key", base, where)
    if user.get("token"):
        return StaticToken(str(user["token"])), cert, key
    if user.get("tokenFile"):
        return TokenFile(_resolve(base, str(user["tokenFile"]))), cert, key
    exec_spec = user.get("exec")
    if isinstance(exec_spec, dict):
        if not exec_spec.get("command"):
            raise ConfigError(f"{where}: exec has no command")
        env_entries = exec_spec.get("env") or []
        if not isinstance(env_entries, list) or not all(
            isinstance(e, dict) and "name" in e and "value" in e for e in env_entries
        ):
            raise ConfigError(f"{where}: exec.env must be a list of {{name, value}}")
        plugin = ExecCredential(
            command=str(exec_spec["command"]),
            args=[str(a) for a in exec_spec.get("args") or []],
            env={str(e["name"]): str(e["value"]) for e in env_entries},
            api_version=str(exec_spec.get("apiVersion") or "client.authentication.k8s.io/v1"),
        )
        return plugin, cert, key
    if user.get("username") or user.get("auth-provider"):
        raise ConfigError(f"{where}: basic auth and auth-provider are not supported; use a token or exec")
    return NoAuth(), cert, key


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
