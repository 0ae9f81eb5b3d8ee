"""Kubeconfig and in-cluster loading (our own small loader, no kubernetes_asyncio import)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodewright.kube.clock import FakeClock
from nodewright.kube.config import (
    ConfigError,
    ExecCredential,
    StaticToken,
    TokenFile,
    load_incluster,
    load_kubeconfig,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "tls.key"),
         "-out", str(d / "tls.crt"), "-days", "1", "-subj", "/CN=test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return {"crt": d / "tls.crt", "key": d / "tls.key"}


def write(path: Path, doc: dict) -> Path:  # type: ignore[type-arg]
    path.write_text(yaml.safe_dump(doc))
    return path


def kubeconfig(user: dict, cluster: dict) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "contexts": [
            {"name": "other", "context": {"cluster": "nope", "user": "nope"}},
            {"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "team"}},
        ],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }


async def test_client_certificate_data_and_ca_data(tmp_path: Path, pki: dict[str, Path]) -> None:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    cfg = load_kubeconfig(
        write(
            tmp_path / "kc",
            kubeconfig(
                {"client-certificate-data": b64(pki["crt"]), "client-key-data": b64(pki["key"])},
                {"server": "https://127.0.0.1:6443/", "certificate-authority-data": b64(pki["crt"]),
                 "tls-server-name": "kubernetes"},
            ),
        )
    )  # fmt: skip
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.ssl_context is not None and cfg.tls_server_name == "kubernetes"
    assert cfg.namespace == "team"
    assert await cfg.auth.authorization() is None


async def test_relative_file_paths_and_token(tmp_path: Path, pki: dict[str, Path]) -> None:
    (tmp_path / "ca.crt").write_bytes(pki["crt"].read_bytes())
    cfg = load_kubeconfig(
        write(
            tmp_path / "kc",
            kubeconfig({"token": "abc"}, {"server": "https://h", "certificate-authority": "ca.crt"}),
        )
    )
    assert isinstance(cfg.auth, StaticToken)
    assert await cfg.auth.authorization() == "Bearer abc"


async def test_token_file_is_reread_for_rotation(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    clock = FakeClock()
    auth = TokenFile(token, clock=clock)
    assert await auth.authorization() == "Bearer one"
    token.write_text("two")
    clock.advance(30)
    assert await auth.authorization() == "Bearer one"
    clock.advance(31)
    assert await auth.authorization() == "Bearer two"
    token.unlink()
    clock.advance(61)
    assert await auth.authorization() == "Bearer two"  # a read error keeps the last token


async def test_exec_plugin_token_cached_until_expiry(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    script = tmp_path / "plugin.py"
    expiry = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    script.write_text(
        "import json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
        f" 'status': {{'token': 'tok' + str(n), 'expirationTimestamp': {expiry!r}}}}}))\n"
    )
    cfg = load_kubeconfig(
        write(tmp_path / "kc", kubeconfig({"exec": {"command": sys.executable, "args": [str(script)]}},
                                          {"server": "http://h"}))
    )  # fmt: skip
    assert isinstance(cfg.auth, ExecCredential)
    assert await cfg.auth.authorization() == "Bearer tok1"
    assert await cfg.auth.authorization() == "Bearer tok1"
    cfg.auth.now = lambda: dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    assert await cfg.auth.authorization() == "Bearer tok2"


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_kubeconfig(tmp_path / "missing")
    doc = kubeconfig({"token": "x"}, {"server": "https://h"})
    with pytest.raises(ConfigError):
        load_kubeconfig(write(tmp_path / "kc", doc), context="other")


async def test_incluster(tmp_path: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(pki["crt"].read_bytes())
    (tmp_path / "namespace").write_text("nodewright-system")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = load_incluster(directory=tmp_path)
    assert cfg.server == "https://[fd00::1]:443"
    assert cfg.namespace == "nodewright-system"
    assert await cfg.auth.authorization() == "Bearer sa-token"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ConfigError):
        load_incluster(directory=tmp_path)


def _error(tmp_path: Path, user: dict, cluster: dict) -> str:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as caught:
        load_kubeconfig(write(tmp_path / "kc", kubeconfig(user, cluster)))
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "kc") in message
    return message


def test_corrupt_ca_names_the_cluster_and_field(tmp_path: Path) -> None:
    garbage = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n").decode()
    message = _error(tmp_path, {"token": "t"}, {"server": "https://h", "certificate-authority-data": garbage})
    assert "cluster 'c': certificate-authority is not a PEM CA certificate" in message
    binary = base64.b64encode(bytes(range(256))).decode()
    message = _error(tmp_path, {"token": "t"}, {"server": "https://h", "certificate-authority-data": binary})
    assert "certificate-authority is not a PEM CA certificate" in message
    message = _error(tmp_path, {"token": "t"}, {"server": "https://h", "certificate-authority-data": "@@@"})
    assert "certificate-authority-data is not valid base64" in message
    message = _error(
        tmp_path, {"token": "t"}, {"server": "https://h", "certificate-authority": "missing.crt"}
    )
    assert (
        f"certificate-authority {tmp_path / 'missing.crt'}: cannot read: No such file or directory" in message
    )


def test_client_certificate_problems_name_the_user(tmp_path: Path, pki: dict[str, Path]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(other / "tls.key"),
         "-out", str(other / "tls.crt"), "-days", "1", "-subj", "/CN=other"],
        check=True, capture_output=True,
    )  # fmt: skip
    cluster = {"server": "https://h", "certificate-authority": str(pki["crt"])}
    mismatched = {"client-certificate": str(pki["crt"]), "client-key": str(other / "tls.key")}
    message = _error(tmp_path, mismatched, cluster)
    assert (
        "user 'u': client-certificate/client-key: not a PEM certificate and its matching private key"
        in message
    )
    message = _error(tmp_path, {"client-certificate": str(pki["crt"])}, cluster)
    assert "client-key is missing" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- just\n- a list\n", "is not a kubeconfig"),
        ("clusters: [\n", "is not valid YAML"),
    ],
)
def test_not_a_kubeconfig(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "kc").write_text(text)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_kubeconfig(tmp_path / "kc")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("flow", [False, True])
async def test_a_json_kubeconfig_is_read_as_its_yaml_twin(tmp_path: Path, flow: bool) -> None:
    """JSON is parsed without PyYAML (the operator's memory); a YAML flow mapping, which starts with `{`
    too but is not JSON, still goes to PyYAML."""
    doc = kubeconfig({"token": "abc"}, {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True})
    text = yaml.safe_dump(doc, default_flow_style=True) if flow else json.dumps(doc, indent=1)
    assert text.lstrip().startswith("{") and (flow != _is_json(text))
    (tmp_path / "kc").write_text(text)
    cfg = load_kubeconfig(tmp_path / "kc")
    twin = load_kubeconfig(write(tmp_path / "twin", doc))
    assert (cfg.server, cfg.namespace, cfg.tls_server_name) == (
        twin.server,
        twin.namespace,
        twin.tls_server_name,
    )
    assert await cfg.auth.authorization() == await twin.auth.authorization() == "Bearer abc"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_json_kubeconfig_does_not_import_pyyaml(tmp_path: Path) -> None:
    doc = kubeconfig({"token": "abc"}, {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True})
    (tmp_path / "kc").write_text(json.dumps(doc))
    probe = (
        "import sys\n"
        "from nodewright.kube.config import load_kubeconfig\n"
        f"load_kubeconfig({str(tmp_path / 'kc')!r})\n"
        "print('yaml' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("server", ["", "127.0.0.1:6443", "ftp://h", "https://"])
def test_server_must_be_an_http_url(tmp_path: Path, server: str) -> None:
    message = _error(tmp_path, {"token": "t"}, {"server": server})
    assert "cluster 'c'" in message and ("server" in message)


def test_exec_without_command(tmp_path: Path) -> None:
    message = _error(
        tmp_path, {"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, {"server": "https://h"}
    )
    assert "user 'u': exec has no command" in message


async def test_exec_plugin_that_cannot_run(tmp_path: Path) -> None:
    plugin = ExecCredential(command=str(tmp_path / "no-such-plugin"))
    with pytest.raises(ConfigError, match="cannot run"):
        await plugin.authorization()


def test_source_names_file_and_context(tmp_path: Path) -> None:
    cfg = load_kubeconfig(write(tmp_path / "kc", kubeconfig({"token": "t"}, {"server": "http://h:8080"})))
    assert cfg.source == f"kubeconfig {tmp_path / 'kc'} (context main)"


def test_an_operator_in_a_cluster_does_not_load_pyyaml(tmp_path: Path, pki: dict[str, Path]) -> None:
    """Only a kubeconfig needs YAML; in a pod the operator reads the service-account files."""
    (tmp_path / "token").write_text("t0k3n")
    (tmp_path / "ca.crt").write_bytes(pki["crt"].read_bytes())
    script = f"""
import os, sys
from pathlib import Path
import nodewright.cli.operator_cmd, nodewright.controller.operator, nodewright.controller.manager
from nodewright.kube.config import load_incluster
os.environ.update(KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
print(load_incluster(directory=Path({str(tmp_path)!r})).server)
print(sorted(m for m in sys.modules if m == "yaml" or m.startswith("yaml.")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["https://10.0.0.1:443", "[]"]
