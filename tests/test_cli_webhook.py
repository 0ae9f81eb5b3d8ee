"""`nodewright webhook` start-up as a real subprocess: bad certificates, a port in use, an absent webhook
configuration or namespace end with one line naming the flag or object (exit 2, no traceback); an
unreachable API server is waited for; the managed mode serves the certificate it stored."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nodewright.webhook import certs, configs
from tests.kubefake import FakeKube, status_body
from tests.test_cli_operator import (
    NOBODY,
    Exited,
    assert_clean,
    free_port,
    occupied_port,
    run_to_exit,
    running,
    write_kubeconfig,
)

ADMISSION = "apis/admissionregistration.k8s.io/v1"
SECRETS = ("api/v1", "nodewright-system", "secrets")


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


def messages(exited: Exited) -> list[str]:
    """stderr without the JSON log lines."""
    return [line for line in exited.lines if not line.startswith("{")]


def webhook_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "nodewright", "webhook", "--bind-address=127.0.0.1", *extra]


def write_pair(directory: Path) -> Path:
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = certs.generate_ca(now)
    cert, key = certs.generate_serving(
        ca, ca_key, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    return directory


def put_configurations(kube: FakeKube) -> None:
    for plural, name in (
        ("validatingwebhookconfigurations", configs.VALIDATING_NAME),
        ("mutatingwebhookconfigurations", configs.MUTATING_NAME),
    ):
        kube.put((ADMISSION, "", plural), {"metadata": {"name": name}, "webhooks": []})


async def test_cert_dir_without_files(tmp_path: Path) -> None:
    exited = await run_to_exit(webhook_argv(f"--cert-dir={tmp_path}"))
    assert exited.code == 2
    assert len(exited.lines) == 1, exited.stderr
    assert exited.lines[0].startswith(f"nodewright webhook: --cert-dir {tmp_path}: cannot read tls.crt")
    assert_clean(exited.stderr)


async def test_cert_dir_with_a_key_that_is_not_the_certificates(tmp_path: Path) -> None:
    first, second = write_pair(tmp_path / "a"), write_pair(tmp_path / "b")
    (first / "tls.key").write_bytes((second / "tls.key").read_bytes())
    exited = await run_to_exit(webhook_argv(f"--cert-dir={first}"))
    assert exited.code == 2
    assert len(exited.lines) == 1, exited.stderr
    assert "tls.crt and tls.key are not a PEM certificate and its private key" in exited.lines[0]
    assert_clean(exited.stderr)


async def test_port_in_use_with_cert_dir(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", NOBODY)
    with occupied_port() as port:
        exited = await run_to_exit(
            webhook_argv(
                f"--kubeconfig={kubeconfig}", f"--cert-dir={write_pair(tmp_path / 'tls')}", f"--port={port}"
            )
        )
    assert exited.code == 2
    assert exited.lines == [
        f"nodewright webhook: --port 127.0.0.1:{port}: cannot listen: Address already in use;"
        " choose a free port"
    ]


async def test_port_in_use_is_reported_before_waiting_for_the_api_server(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", NOBODY)
    with occupied_port() as port:
        exited = await run_to_exit(webhook_argv(f"--kubeconfig={kubeconfig}", f"--port={port}"), within=20)
    assert exited.code == 2
    assert exited.lines == [
        f"nodewright webhook: --port 127.0.0.1:{port}: cannot listen: Address already in use;"
        " choose a free port"
    ]


async def test_corrupt_kubeconfig(tmp_path: Path) -> None:
    bad = write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", **{"certificate-authority-data": "@@"})
    exited = await run_to_exit(webhook_argv(f"--kubeconfig={bad}"))
    assert exited.code == 2
    assert len(exited.lines) == 1 and "certificate-authority-data is not valid base64" in exited.lines[0]


@pytest.mark.parametrize("present", [(), ("validating",)], ids=["none", "only-validating"])
async def test_managed_mode_needs_its_configurations(
    present: tuple[str, ...], kube: FakeKube, tmp_path: Path
) -> None:
    if present:
        kube.put(
            (ADMISSION, "", "validatingwebhookconfigurations"),
            {"metadata": {"name": configs.VALIDATING_NAME}, "webhooks": []},
        )
    missing = (
        "MutatingWebhookConfiguration nodewright-mutating" if present else "ValidatingWebhookConfiguration"
    )
    kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url)
    exited = await run_to_exit(webhook_argv(f"--kubeconfig={kubeconfig}", f"--port={free_port()}"))
    assert exited.code == 2, exited.stderr
    assert messages(exited) == [exited.lines[-1]], exited.stderr
    error = exited.lines[-1]
    assert missing in error and "apply manifests/webhook/webhook-configurations.yaml" in error
    assert "--cert-dir" in error
    assert_clean(exited.stderr)


async def test_managed_mode_needs_its_namespace(kube: FakeKube, tmp_path: Path) -> None:
    put_configurations(kube)
    body = status_body(404, "NotFound", 'namespaces "nodewright-system" not found')
    body["details"] = {"name": "nodewright-system", "kind": "namespaces"}
    kube.fail("POST", "/namespaces/nodewright-system/secrets", 404, body=body)
    kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url)
    exited = await run_to_exit(webhook_argv(f"--kubeconfig={kubeconfig}", f"--port={free_port()}"))
    assert exited.code == 2, exited.stderr
    assert exited.lines[-1].startswith("nodewright webhook: namespace 'nodewright-system' does not exist")
    assert messages(exited) == [exited.lines[-1]], exited.stderr
    assert_clean(exited.stderr)


async def test_managed_mode_waits_for_the_api_server(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", NOBODY)
    port = free_port()
    async with running(webhook_argv(f"--kubeconfig={kubeconfig}", f"--port={port}")) as hook:

        def attempts() -> list[dict[str, Any]]:
            return [e for e in hook.events() if str(e.get("event", "")).startswith("API server unreachable")]

        await hook.wait_for(lambda: len(attempts()) >= 2, within=30, what="two attempts")
        assert attempts()[0]["server"] == NOBODY and "webhook certificate" in attempts()[0]["event"]
        # Not listening without a certificate: the chart's readiness probe is the open port.
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        done = await hook.terminate()
    assert done.code == 0, done.stderr
    assert_clean(done.stderr)


async def test_managed_mode_serves_the_certificate_it_stored(kube: FakeKube, tmp_path: Path) -> None:
    put_configurations(kube)
    kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url)
    port = free_port()
    async with running(webhook_argv(f"--kubeconfig={kubeconfig}", f"--port={port}")) as hook:
        await hook.wait_for(
            lambda: any(e.get("event") == "webhook listening" for e in hook.events()),
            within=30,
            what="listening",
        )
        await hook.wait_for(
            lambda: kube.get(SECRETS, "nodewright-webhook-tls") is not None, within=30, what="Secret"
        )
        secret = kube.get(SECRETS, "nodewright-webhook-tls")
        assert secret is not None
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        context = ssl.create_default_context(cadata=ca)
        context.check_hostname = False  # the serving cert names the Service, not 127.0.0.1

        async def healthz() -> int:
            url = f"https://127.0.0.1:{port}/healthz"
            timeout = aiohttp.ClientTimeout(total=5)
            async with (
                aiohttp.ClientSession() as session,
                session.get(url, ssl=context, timeout=timeout) as resp,
            ):
                return resp.status

        for _ in range(100):  # the chain is loaded right after the Secret is written
            try:
                assert await healthz() == 200
                break
            except (aiohttp.ClientError, ssl.SSLError):
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the webhook never presented the stored certificate")
        done = await hook.terminate()
    assert done.code == 0, done.stderr
    assert_clean(done.stderr)
