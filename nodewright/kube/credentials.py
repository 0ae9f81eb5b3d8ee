"""Who the API server is talking to: the credentials of a kubeconfig user or a service account.

Each `Auth` gives the `Authorization` header of the next request (None: the client certificate of the
TLS handshake identifies us, or nothing does) and can be told that the API server refused it
(`expire()`, on a 401), after which it produces a fresh credential if it can. client-go does the same:
a rotated token file is re-read and an exec plugin runs again, instead of failing until restart.

- `StaticToken`, `BasicAuth`: `users[].user.token`, `username`/`password` (sent as given; nothing to
  refresh).
- `TokenFile`: `tokenFile`, or a projected service-account token. Bound tokens are rotated by the
  kubelet (hourly by default, valid longer), so the file is re-read at most once a minute (and at once
  after a 401), rather than cached for the life of the process; a read error keeps the last token.
- `ExecCredential`: `users[].user.exec`, the client.authentication.k8s.io credential plugins (v1,
  v1beta1) that cloud CLIs implement (`aws eks get-token`, `gke-gcloud-auth-plugin`, `kubelogin`), run
  as kubectl runs them:
  - the plugin gets `KUBERNETES_EXEC_INFO` (an ExecCredential with `spec.interactive`, and
    `spec.cluster` when `provideClusterInfo` is true), the `env` entries on top of our environment, and
    the argument list; its answer must be an ExecCredential of the same apiVersion;
  - `status.token` is the bearer token; `status.clientCertificateData`/`clientKeyData` (PEM) are a
    client certificate, loaded into the connection's TLS context before the next handshake; both are
    kept until `status.expirationTimestamp` (10 s early), or until a 401;
  - `interactiveMode`: `Never` gives the plugin no terminal; `IfAvailable` (the default) gives it
    stdin and stderr when stdin is a terminal, so a login prompt or a device-code URL reaches the
    person, and then waits up to 5 minutes instead of 30 s; `Always` refuses to run without a terminal;
  - a plugin that cannot be started is reported with the kubeconfig's `installHint`; one that fails
    with its exit code and the tail of what it printed on stderr (when that was not the terminal).

Every failure is a `ConfigError` with one line naming the command and what to do.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import ssl
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from nodewright.kube.clock import SYSTEM_CLOCK, Clock

TOKEN_REFRESH_SECONDS: Final = 60.0
EXEC_TIMEOUT_SECONDS: Final = 30.0
EXEC_INTERACTIVE_TIMEOUT_SECONDS: Final = 300.0
EXPIRY_MARGIN: Final = dt.timedelta(seconds=10)
EXEC_API_VERSIONS: Final = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES: Final = ("Never", "IfAvailable", "Always")


class ConfigError(Exception):
    """Connection settings that cannot work: a usage problem, never an outage."""


class Auth(Protocol):
    async def authorization(self) -> str | None:
        """The value of the Authorization header (or None for certificate-only auth)."""
        ...

    def expire(self) -> bool:
        """The API server refused the credential (401): drop what is cached. True when the next
        request may carry a different credential (then one retry is worth it)."""
        ...


class NoAuth:
    async def authorization(self) -> str | None:
        return None

    def expire(self) -> bool:
        return False


@dataclass
class StaticToken:
    token: str

    async def authorization(self) -> str | None:
        return f"Bearer {self.token}"

    def expire(self) -> bool:
        return False


@dataclass
class BasicAuth:
    """`username`/`password` (HTTP basic authentication; API servers rarely enable it)."""

    username: str
    password: str

    async def authorization(self) -> str | None:
        pair = f"{self.username}:{self.password}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"

    def expire(self) -> bool:
        return False


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

    def expire(self) -> bool:
        self._read_at = None
        return True


class NoTempDir(OSError):
    """Neither an in-memory file nor a writable temporary directory is available for a PEM pair."""


TEMP_DIR_REMEDY: Final = (
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


def load_client_pair(context: ssl.SSLContext, cert: bytes, key: bytes, *, what: str) -> None:
    """Load a PEM client certificate and key into `context` (`load_pem_chain`); `what` names them in
    the error."""
    try:
        load_pem_chain(context, cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"{what}: not a PEM certificate and its matching private key ({_one_line(exc)})"
        ) from None
    except NoTempDir as exc:
        raise ConfigError(f"{what}: {exc}") from None


@dataclass
class ExecCredential:
    """The `users[].user.exec` plugin (module docstring)."""

    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_version: str = "client.authentication.k8s.io/v1"
    interactive_mode: str = "IfAvailable"
    install_hint: str = ""
    cluster: Mapping[str, Any] | None = None
    """`spec.cluster` of KUBERNETES_EXEC_INFO (set when the kubeconfig says `provideClusterInfo`)."""
    ssl_context: ssl.SSLContext | None = None
    """Where a client certificate the plugin returns is loaded (the API server connection's context)."""
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    stdin_is_terminal: Callable[[], bool] = lambda: sys.stdin is not None and sys.stdin.isatty()
    _token: str | None = None
    _expires: dt.datetime | None = None
    _fresh: bool = False
    _pair: tuple[bytes, bytes] | None = None

    async def authorization(self) -> str | None:
        if not self._fresh or (self._expires is not None and self.now() >= self._expires):
            self._use(await self.run())
        return f"Bearer {self._token}" if self._token else None

    def expire(self) -> bool:
        self._fresh = False
        return True

    def _use(self, status: Mapping[str, Any]) -> None:
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert and key):
            raise ConfigError(
                f"exec plugin {self.command} returned neither status.token nor"
                " status.clientCertificateData and clientKeyData"
            )
        if cert and key and self.ssl_context is not None:
            pair = (str(cert).encode(), str(key).encode())
            if pair != self._pair:
                load_client_pair(
                    self.ssl_context, *pair, what=f"exec plugin {self.command}: client certificate"
                )
                self._pair = pair
        self._token = str(token) if token else None
        expiry = status.get("expirationTimestamp")
        self._expires = _parse_time(str(expiry), self.command) - EXPIRY_MARGIN if expiry else None
        self._fresh = True

    def _interactive(self) -> bool:
        terminal = self.stdin_is_terminal()
        if self.interactive_mode == "Always" and not terminal:
            raise ConfigError(
                f"exec plugin {self.command} has interactiveMode Always and needs a terminal; run it"
                " from one, or set interactiveMode IfAvailable"
            )
        return terminal and self.interactive_mode != "Never"

    def exec_info(self, *, interactive: bool) -> str:
        spec: dict[str, Any] = {"interactive": interactive}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})

    async def run(self) -> dict[str, Any]:
        """Run the plugin once; its ExecCredential's `status`."""
        interactive = self._interactive()
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": self.exec_info(interactive=interactive)}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command,
                *self.args,
                env=env,
                stdin=None if interactive else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=None if interactive else asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            hint = f"; {_one_line(self.install_hint)}" if self.install_hint else ""
            raise ConfigError(
                f"exec plugin {self.command}: cannot run: {exc.strerror or exc}{hint}"
            ) from None
        limit = EXEC_INTERACTIVE_TIMEOUT_SECONDS if interactive else EXEC_TIMEOUT_SECONDS
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ConfigError(f"exec plugin {self.command} timed out after {limit:g}s") from None
        if proc.returncode != 0:
            said = _one_line((err or b"").decode(errors="replace"))[-500:]
            detail = f": {said}" if said else ""
            raise ConfigError(f"exec plugin {self.command} failed (exit {proc.returncode}){detail}")
        return self._status(out)

    def _status(self, out: bytes) -> dict[str, Any]:
        try:
            credential = json.loads(out)
        except ValueError:
            raise ConfigError(f"exec plugin {self.command} printed no ExecCredential JSON") from None
        if not isinstance(credential, dict):
            raise ConfigError(f"exec plugin {self.command} printed no ExecCredential JSON")
        returned = credential.get("apiVersion")
        if returned != self.api_version:
            raise ConfigError(
                f"exec plugin {self.command} is configured for {self.api_version} but returned"
                f" {returned!r}; set exec.apiVersion to what the plugin speaks"
            )
        status = credential.get("status")
        if not isinstance(status, dict):
            raise ConfigError(f"exec plugin {self.command} returned no status")
        return status


def _parse_time(value: str, command: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"exec plugin {command}: expirationTimestamp {value!r} is not an RFC 3339 time"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())
