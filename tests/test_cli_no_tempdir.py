"""The operator and the webhook on a root file system without a usable temporary directory.

Hardened pods run with `readOnlyRootFilesystem` and mount a writable /tmp only if someone thought of it.
The processes load TLS material (a kubeconfig's client certificate, the webhook's serving pair) through
`nodewright.kube.config.load_pem_chain`, which needs no temporary directory on Linux; where one is still
needed the process ends with one line naming what is missing and exit status 2, never a traceback.

The processes run as real subprocesses with Python's temporary-directory candidates replaced by a
directory that does not exist: exactly what `tempfile` meets when $TMPDIR, /tmp and /var/tmp are all
missing or read-only (a root-owned test cannot make /tmp unwritable otherwise).
"""

from __future__ import annotations

import base64
import os
import ssl
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright.kube import config as kubeconfig
from nodewright.kube.config import NoTempDir, load_kubeconfig, load_pem_chain
from tests.test_cli_operator import NOBODY, assert_clean, free_port, running, write_kubeconfig
from tests.test_cli_webhook import write_pair

MISSING = "/nonexistent/nodewright-no-tmp"
# Runs `nodewright ARGS...` in a process whose tempfile finds no usable directory.
NO_TEMPDIR = (
    "import sys, tempfile\n"
    "tempfile.tempdir = None\n"
    f"tempfile._candidate_tempdir_list = lambda: [{MISSING!r}]\n"
    "from nodewright.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def without_tempdir(*args: str) -> list[str]:
    return [sys.executable, "-c", NO_TEMPDIR, *args]


def client_cert_kubeconfig(path: Path, pair: Path, server: str) -> Path:
    """A kubeconfig with embedded client certificate and key (mutual TLS), like `nodewright sim`'s."""

    def b64(name: str) -> str:
        return base64.b64encode((pair / name).read_bytes()).decode()

    cluster = {"server": server, "certificate-authority-data": b64("tls.crt")}
    user = {"client-certificate-data": b64("tls.crt"), "client-key-data": b64("tls.key")}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_tempdir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [MISSING])


def test_pem_pairs_load_in_memory_without_a_tempdir(tmp_path: Path, no_tempdir: None) -> None:
    pair = write_pair(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_pem_chain(context, (pair / "tls.crt").read_bytes(), (pair / "tls.key").read_bytes())
    cfg = load_kubeconfig(client_cert_kubeconfig(tmp_path / "kc", pair, "https://127.0.0.1:6443"))
    assert cfg.ssl_context is not None


def test_without_memfd_a_missing_tempdir_is_one_line(
    tmp_path: Path, no_tempdir: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    pair = write_pair(tmp_path / "tls")
    with pytest.raises(NoTempDir) as caught:
        load_pem_chain(ssl.create_default_context(), (pair / "tls.crt").read_bytes(), b"key")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("no writable temporary directory (")
    assert MISSING in message and "mount a writable directory at /tmp" in message and "$TMPDIR" in message
    with pytest.raises(kubeconfig.ConfigError, match=r"client-certificate/client-key: no writable temporary"):
        load_kubeconfig(client_cert_kubeconfig(tmp_path / "kc", pair, "https://127.0.0.1:6443"))


async def test_operator_with_a_client_certificate_starts_without_a_tempdir(tmp_path: Path) -> None:
    kc = client_cert_kubeconfig(
        tmp_path / "kc", write_pair(tmp_path / "tls"), NOBODY.replace("http", "https")
    )
    argv = without_tempdir(
        "operator", f"--kubeconfig={kc}", "--health-probe-bind-address=0", "--metrics-bind-address=0",
        "--log-format=json", "--no-leader-elect",
    )  # fmt: skip
    async with running(argv) as op:

        def attempts() -> list[dict[str, Any]]:
            return [e for e in op.events() if str(e.get("event", "")).startswith("API server unreachable")]

        await op.wait_for(lambda: bool(attempts()), within=30, what="the first API server attempt")
        exited = await op.terminate()
    assert exited.code == 0, exited.stderr
    assert_clean(exited.stderr)


async def test_webhook_serves_its_cert_dir_without_a_tempdir(tmp_path: Path) -> None:
    kc, pair = write_kubeconfig(tmp_path / "kc", NOBODY), write_pair(tmp_path / "tls")
    argv = without_tempdir(
        "webhook", "--bind-address=127.0.0.1", f"--port={free_port()}", f"--kubeconfig={kc}",
        f"--cert-dir={pair}",
    )  # fmt: skip
    async with running(argv) as hook:
        await hook.wait_for(
            lambda: any(e.get("event") == "webhook listening" for e in hook.events()),
            within=30,
            what="listening",
        )
        exited = await hook.terminate()
    assert exited.code == 0, exited.stderr
    assert_clean(exited.stderr)


async def test_webhook_with_a_client_certificate_kubeconfig_needs_no_tempdir(tmp_path: Path) -> None:
    """The webhook talks to the API server through the project's one client (`nodewright.kube`), which
    loads a kubeconfig's embedded certificates from memory: like the operator, it needs no temporary
    directory (kubernetes_asyncio, which it used before, wrote them to temporary files)."""
    kc = client_cert_kubeconfig(tmp_path / "kc", write_pair(tmp_path / "tls"), "https://127.0.0.1:1")
    argv = without_tempdir(
        "webhook", "--bind-address=127.0.0.1", f"--port={free_port()}", f"--kubeconfig={kc}"
    )
    async with running(argv) as hook:

        def attempts() -> list[dict[str, Any]]:
            return [e for e in hook.events() if str(e.get("event", "")).startswith("API server unreachable")]

        await hook.wait_for(lambda: bool(attempts()), within=30, what="the first API server attempt")
        exited = await hook.terminate()
    assert exited.code == 0, exited.stderr
    assert_clean(exited.stderr)
