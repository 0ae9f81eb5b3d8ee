"""The allocator settings and the periodic heap trim (observability/heap.py)."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ctypes.util
import platform
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodewright.observability import heap


class FakeAllocator:
    def __init__(self, *, refuse: int | None = None, releases: bool = True) -> None:
        self.settings: list[tuple[int, int]] = []
        self.trims = 0
        self.refuse = refuse
        self.releases = releases

    def mallopt(self, param: int, value: int) -> int:
        self.settings.append((param, value))
        return 0 if param == self.refuse else 1

    def malloc_trim(self, pad: int) -> int:
        assert pad == 0
        self.trims += 1
        return 1 if self.releases else 0


def test_tuning_fixes_both_thresholds_and_the_arena_count() -> None:
    fake = FakeAllocator()
    assert heap.tune_allocator(fake) is True
    assert dict(fake.settings) == {
        heap.M_MMAP_THRESHOLD: heap.MMAP_THRESHOLD_BYTES,
        heap.M_TRIM_THRESHOLD: heap.TRIM_THRESHOLD_BYTES,
        heap.M_ARENA_MAX: heap.ARENAS,
    }


def test_a_refused_setting_is_reported() -> None:
    assert heap.tune_allocator(FakeAllocator(refuse=heap.M_ARENA_MAX)) is False


async def test_the_trimmer_trims_once_per_interval_until_stopped() -> None:
    fake = FakeAllocator()
    intervals: list[float] = []
    slept = asyncio.Event()

    async def sleep(seconds: float) -> None:
        intervals.append(seconds)
        if len(intervals) > 3:
            slept.set()
            await asyncio.Event().wait()  # the fourth interval never ends
        await asyncio.sleep(0)

    trimmer = heap.HeapTrimmer(fake, interval=7.0, sleep=sleep)
    assert trimmer.start() is not None
    await asyncio.wait_for(slept.wait(), 5)
    await trimmer.stop()
    assert fake.trims == 3 and trimmer.trims == 3
    assert intervals == [7.0] * 4


async def test_without_glibc_nothing_runs() -> None:
    assert heap.tune_allocator(None) is False
    trimmer = heap.HeapTrimmer(None)  # as on musl or macOS, where glibc() finds no malloc_trim
    assert not trimmer.available
    assert trimmer.start() is None
    assert trimmer.trim() is False
    await trimmer.stop()


def test_a_trim_says_whether_memory_was_released() -> None:
    assert heap.HeapTrimmer(FakeAllocator(releases=True)).trim() is True
    assert heap.HeapTrimmer(FakeAllocator(releases=False)).trim() is False


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        heap.HeapTrimmer(FakeAllocator(), interval=0)


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not ctypes.util.find_library("c"),
    reason="glibc only",
)
def test_this_glibc_accepts_the_settings_and_trims() -> None:
    libc = heap.glibc()
    assert libc is not None
    assert heap.tune_allocator(libc) is True
    assert heap.HeapTrimmer(libc).trim() in (True, False)


@pytest.fixture
def restore_tls_read_buffer() -> Iterator[None]:
    original = asyncio.sslproto.SSLProtocol.max_size
    yield
    asyncio.sslproto.SSLProtocol.max_size = original


def test_a_tls_read_buffer_must_hold_a_record(restore_tls_read_buffer: None) -> None:
    with pytest.raises(ValueError, match="16 KiB"):
        heap.shrink_tls_read_buffers(4096)
    asyncio.sslproto.SSLProtocol.max_size = 256 * 1024  # asyncio's own; an in-process operator run changed it
    assert heap.shrink_tls_read_buffers() == 256 * 1024, "the size before the change"
    assert asyncio.sslproto.SSLProtocol.max_size == heap.TLS_READ_BUFFER_BYTES


@pytest.fixture
def localhost_certificate(tmp_path: Path) -> tuple[Path, Path]:
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


async def test_tls_connections_read_a_large_body_whole_through_the_smaller_buffer(
    localhost_certificate: tuple[Path, Path], restore_tls_read_buffer: None
) -> None:
    crt, key = localhost_certificate
    heap.shrink_tls_read_buffers()
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(crt, key)
    client_context = ssl.create_default_context(cafile=str(crt))
    body = bytes(range(256)) * 8192  # 2 MiB: many buffers' worth
    protocols: list[asyncio.BaseProtocol] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_context, server_hostname="localhost"), 10
        )
        protocols.append(writer.transport._ssl_protocol)  # type: ignore[attr-defined]
        received = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
    assert received == body
    assert len(protocols[0]._ssl_buffer) == heap.TLS_READ_BUFFER_BYTES  # type: ignore[attr-defined]


# aiohttp is imported by this test process already: `import_http_client` is judged in a fresh interpreter.
IMPORT_PROBE = """
import json, os, ssl, sys
from nodewright.observability import heap
first = heap.import_http_client()
import aiohttp.connector as connector
from nodewright.observability.heap import system_tls_context
print(json.dumps({
    "first": first,
    "again": heap.import_http_client(),
    "env": os.environ.get("SSL_CERT_FILE"),
    "aiohttp_verified": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509"],
    "aiohttp_unverified": connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509"],
    "default": ssl.create_default_context().cert_store_stats()["x509"],
    "sink": system_tls_context().cert_store_stats()["x509"],
    "sink_verifies": system_tls_context().verify_mode == ssl.CERT_REQUIRED,
}))
"""


def _probe(env_file: str | None) -> dict[str, object]:
    import json
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    if env_file is not None:
        env["SSL_CERT_FILE"] = env_file
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, env=env, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("named", [False, True], ids=["no SSL_CERT_FILE", "SSL_CERT_FILE set"])
def test_aiohttp_is_imported_without_loading_a_ca_bundle_into_its_unused_contexts(named: bool) -> None:
    bundle = ssl.get_default_verify_paths().cafile or ssl.get_default_verify_paths().openssl_cafile
    if not bundle or not Path(bundle).is_file():
        pytest.skip("no system CA bundle on this machine")
    probe = _probe(bundle if named else None)
    assert probe["first"] is True and probe["again"] is False
    # The environment is as it was: unset, or the file the environment named.
    assert probe["env"] == (bundle if named else None)
    assert probe["aiohttp_verified"] == 0 and probe["aiohttp_unverified"] == 0
    # Contexts built afterwards load the bundle as usual; the sinks' context verifies against it.
    assert probe["default"] == probe["sink"] and probe["sink"] > 0  # type: ignore[operator]
    assert probe["sink_verifies"] is True


def test_the_operator_command_imports_aiohttp_only_through_import_http_client() -> None:
    # `nodewright operator` calls import_http_client() first thing in `run`: nothing imported before
    # (the CLI's entry point and the operator command's module) may have imported aiohttp already.
    import sys

    probe = "import sys, nodewright.cli.main, nodewright.cli.operator_cmd; print('aiohttp' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


def test_every_outbound_call_of_the_operator_verifies_against_the_system_store() -> None:
    """In the operator aiohttp's default context has no CA file (`import_http_client`): a call to an
    endpoint outside the cluster (a sink, a health gate's Prometheus) passes `ssl=` itself, or HTTPS
    to a public endpoint would fail verification."""
    import ast
    from pathlib import Path

    import nodewright

    calls = [
        (path.name, node.lineno, any(k.arg == "ssl" for k in node.keywords))
        for path in sorted((Path(nodewright.__file__).parent / "controller").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"get", "post", "put", "request"}
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "session"
    ]
    assert {name for name, _, _ in calls} >= {"notify.py", "gates.py"}
    assert [c for c in calls if not c[2]] == []
