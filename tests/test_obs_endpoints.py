"""The probe and scrape endpoint server (observability/endpoints.py), over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from nodewright.observability.endpoints import (
    MAX_HEAD_BYTES,
    BadRequest,
    EndpointServer,
    Reply,
    answer,
    parse_request_head,
    render_reply,
)


def broken() -> Reply:
    raise RuntimeError("route bug")


ROUTES = {"/ok": lambda: Reply(200, b"fine\n"), "/broken": broken}


@pytest.fixture
async def server() -> AsyncIterator[EndpointServer]:
    srv = EndpointServer(ROUTES, read_timeout=0.3, max_connections=2)
    await srv.start("127.0.0.1", 0)
    yield srv
    await srv.stop()


async def exchange(port: int | None, request: bytes) -> bytes:
    assert port is not None
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


def test_request_heads_are_read_strictly() -> None:
    assert parse_request_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == ("GET", "/metrics")
    assert parse_request_head(b"HEAD /readyz HTTP/1.0\r\n\r\n") == ("HEAD", "/readyz")
    for bad in (b"GET /metrics\r\n\r\n", b"GET metrics HTTP/1.1\r\n\r\n", b"get / HTTP/1.1\r\n\r\n",
                b"GET / HTTP/2\r\n\r\n", b"\x16\x03\x01 TLS hello\r\n\r\n"):  # fmt: skip
        with pytest.raises(BadRequest):
            parse_request_head(bad)


def test_answers_per_method_and_path() -> None:
    assert answer(ROUTES, "GET", "/ok").body == b"fine\n"
    assert answer(ROUTES, "GET", "/nope").status == 404
    denied = answer(ROUTES, "POST", "/ok")
    assert denied.status == 405 and denied.headers["Allow"] == "GET, HEAD"
    assert answer(ROUTES, "GET", "/broken").status == 500


def test_a_reply_states_its_length_and_closes() -> None:
    raw = render_reply(Reply(503, b'{"ready": false}', content_type="application/json"))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 503 Service Unavailable",
        b"Content-Type: application/json",
        b"Content-Length: 16",
        b"Connection: close",
    ]
    assert body == b'{"ready": false}'
    assert render_reply(Reply(200, b"abc"), with_body=False).endswith(
        b"Content-Length: 3\r\nConnection: close\r\n\r\n"
    )


async def test_an_http_client_gets_the_route_and_its_status(server: EndpointServer) -> None:
    async with aiohttp.ClientSession() as session:
        for path, status, body in (("/ok", 200, "fine\n"), ("/missing", 404, "not found\n")):
            async with session.get(f"http://127.0.0.1:{server.port}{path}") as resp:
                assert (resp.status, await resp.text()) == (status, body)
        async with session.head(f"http://127.0.0.1:{server.port}/ok") as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == "5"
        async with session.post(f"http://127.0.0.1:{server.port}/ok", data=b"x") as resp:
            assert resp.status == 405


async def test_a_failing_route_is_a_500_and_the_server_keeps_serving(server: EndpointServer) -> None:
    assert (await exchange(server.port, b"GET /broken HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 500 ")
    assert (await exchange(server.port, b"GET /ok HTTP/1.1\r\n\r\n")).endswith(b"\r\n\r\nfine\n")


async def test_garbage_and_oversized_heads_are_400(server: EndpointServer) -> None:
    assert (await exchange(server.port, b"hello there\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    huge = b"GET /ok HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
    assert (await exchange(server.port, huge)).startswith(b"HTTP/1.1 400 ")


async def test_a_silent_client_is_dropped_after_the_read_timeout(server: EndpointServer) -> None:
    assert server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /ok HTTP/1.1\r\n")  # never finishes its head
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_connections_over_the_limit_are_closed_at_once(server: EndpointServer) -> None:
    assert server.port is not None
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    await asyncio.sleep(0.05)  # both accepted and waiting for their request
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await asyncio.wait_for(reader.read(), 0.25) == b"", "closed before the read timeout"
    writer.close()
    for _, held_writer in held:
        held_writer.close()


async def test_stop_closes_open_connections() -> None:
    srv = EndpointServer(ROUTES, read_timeout=30)
    await srv.start("127.0.0.1", 0)
    assert srv.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    await asyncio.sleep(0.05)
    await asyncio.wait_for(srv.stop(), 5)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
