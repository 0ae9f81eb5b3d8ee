"""Cache benchmark: memory per trimmed node, and watch events processed per second on one core.

Memory: 10,000 realistic GPU nodes (the simulator's h100 profile: ~70 labels, capacity, addresses,
conditions, nodeInfo) arrive as JSON lines, as from a watch, and go through `json.loads` → `trim_node`
→ the store, one at a time (the raw objects are dropped as they would be). Reported two ways:
tracemalloc (bytes the cache still holds) and the process RSS delta. Target: ≤ 5 KiB per node.

Throughput: MODIFIED events for those nodes (one label changing) through the reflector's hot path —
line decode → `handle_event` → `trim_node` → store upsert → an event handler that enqueues the key into
a `WorkQueue` — measured twice: fed straight into the decode path (pure CPU), and read from a local
aiohttp server over a real watch request (adds HTTP chunk parsing and the event loop). The process is
single-threaded, so events per CPU-second is events per second on one core.

Run: `python -m benchmarks.bench_cache [--nodes 10000] [--events 50000]`; writes
`benchmarks/results/cache.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from nodewright.kube.client import KubeClient
from nodewright.kube.config import ClusterConfig, NoAuth
from nodewright.kube.informer import Informer
from nodewright.kube.resources import JSON, NODES
from nodewright.kube.trim import trim_node
from nodewright.kube.workqueue import WorkQueue
from nodewright.sim.fleet import node_manifest

RESULTS = Path(__file__).parent / "results" / "cache.json"


def node_lines(count: int, *, prefix: str = "gpu") -> Iterator[bytes]:
    """Watch-event lines for `count` nodes; each node gets a unique uid and resourceVersion."""
    for i in range(count):
        node = node_manifest(i, profile="h100", name_prefix=prefix)
        meta = node["metadata"]
        meta["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        meta["resourceVersion"] = str(1000 + i)
        meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
        meta.setdefault("annotations", {})["nodewright.io/state.demo"] = '{"v":1,"stage":"config"}'
        meta["annotations"]["node.alpha.kubernetes.io/ttl"] = "0"
        yield json.dumps({"type": "ADDED", "object": node}).encode() + b"\n"


def fill(informer: Informer, lines: Iterator[bytes]) -> None:
    for line in lines:
        event = json.loads(line)
        informer.reflector.handle_event(event)
        del event, line


def _informer() -> Informer:
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", ssl_context=None, auth=NoAuth()))
    return Informer(client, NODES, transform=trim_node)


def measure_memory(count: int) -> dict[str, Any]:
    sample = next(node_lines(1))
    process = psutil.Process()
    gc.collect()
    rss_before = process.memory_info().rss
    rss_informer = _informer()
    fill(rss_informer, node_lines(count, prefix="rss"))
    gc.collect()
    rss_delta = process.memory_info().rss - rss_before

    gc.collect()
    tracemalloc.start()
    informer = _informer()
    base = tracemalloc.get_traced_memory()[0]
    fill(informer, node_lines(count))
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    kept = informer.get("gpu-00007")
    assert kept is not None and len(informer.store) == count
    del rss_informer
    return {
        "nodes": count,
        "raw_json_bytes_per_node": len(sample),
        "labels_per_node": len(kept["metadata"]["labels"]),
        "tracemalloc_bytes_per_node": round(traced / count),
        "rss_delta_bytes_per_node": round(rss_delta / count),
        "target_bytes_per_node": 5 * 1024,
    }


def modified_lines(count: int, events: int) -> list[bytes]:
    """`events` MODIFIED lines cycling over `count` nodes, a label value changing each time."""
    templates = [json.loads(line)["object"] for line in node_lines(count)]
    out = []
    for n in range(events):
        node = templates[n % count]
        node["metadata"]["resourceVersion"] = str(100_000 + n)
        node["metadata"]["labels"]["nodewright.io/status.demo"] = ("in_progress", "complete")[n % 2]
        out.append(json.dumps({"type": "MODIFIED", "object": node}).encode() + b"\n")
    return out


def _with_queue(informer: Informer) -> WorkQueue[str]:
    queue: WorkQueue[str] = WorkQueue("bench")
    informer.add_handler(
        on_add=lambda o: queue.add(o["metadata"]["name"]),
        on_update=lambda old, new: queue.add(new["metadata"]["name"]),
    )
    return queue


def measure_decode_path(count: int, lines: list[bytes]) -> dict[str, Any]:
    informer = _informer()
    _with_queue(informer)
    fill(informer, node_lines(count))
    reflector = informer.reflector

    class _Decoder:
        malformed = 0

    from nodewright.kube.client import WatchStream

    decode = WatchStream.decode
    decoder: Any = _Decoder()
    gc.collect()
    cpu0 = time.process_time()
    for line in lines:
        event = decode(decoder, line)
        if event is not None:
            reflector.handle_event(event)
    cpu = time.process_time() - cpu0
    return {
        "events": len(lines),
        "cpu_seconds": round(cpu, 3),
        "events_per_cpu_second": round(len(lines) / cpu),
    }


async def measure_http_path(count: int, lines: list[bytes]) -> dict[str, Any]:
    payload = b"".join(lines)

    async def watch(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": []})
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        for start in range(0, len(payload), 1 << 16):
            await resp.write(payload[start : start + (1 << 16)])
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/nodes", watch)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = KubeClient(ClusterConfig(server=f"http://127.0.0.1:{port}", ssl_context=None, auth=NoAuth()))
    informer = Informer(client, NODES, transform=trim_node)
    _with_queue(informer)
    fill(informer, node_lines(count))
    informer.reflector.resource_version = "1"
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await informer.reflector.watch_once()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await client.close()
    await runner.cleanup()
    # Server and client share this process: the CPU figure includes the server writing the stream.
    return {
        "events": len(lines),
        "wall_seconds": round(wall, 3),
        "cpu_seconds_incl_server": round(cpu, 3),
        "events_per_second": round(len(lines) / wall),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args(argv)
    memory = measure_memory(args.nodes)
    lines = modified_lines(min(args.nodes, 2000), args.events)
    decode = measure_decode_path(min(args.nodes, 2000), lines)
    http = asyncio.run(measure_http_path(min(args.nodes, 2000), lines))
    result: JSON = {"memory": memory, "decode_path": decode, "http_watch_path": http}
    print(
        f"cache memory, {memory['nodes']} nodes with {memory['labels_per_node']} labels "
        f"(raw JSON {memory['raw_json_bytes_per_node']} B/node):"
    )
    print(
        f"  tracemalloc {memory['tracemalloc_bytes_per_node'] / 1024:.2f} KiB/node, "
        f"RSS delta {memory['rss_delta_bytes_per_node'] / 1024:.2f} KiB/node (target <= 5 KiB)"
    )
    print(f"decode->transform->store->handler: {decode['events_per_cpu_second']:,} events/CPU-second")
    print(
        f"same over a local HTTP watch:      {http['events_per_second']:,} events/second (server in-process)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
