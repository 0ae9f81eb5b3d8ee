"""The operator's heap: how glibc's allocator is set up and when freed memory goes back to the kernel.

An informer's first list decodes every node of the fleet a page at a time (each page's JSON is decoded
whole), keeps the trimmed copies and drops the rest. CPython hands blocks over 512 bytes to glibc `malloc`,
and glibc keeps what is freed in its heap instead of returning it: it raises its mmap threshold after
the first large `free` (so the next list page lands in the heap too), and it only gives the top of the
heap back. The resident set a dashboard shows then stays at the start-up peak for the life of the
process — about 10 MiB above what a 1,000-node operator holds (docs/benchmarks.md "Idle memory").

Two measures, both no-ops where the C library is not glibc (the tests' fakes stand in for it):

- `tune_allocator()` at start, before any thread exists: a fixed mmap threshold (large bodies are
  mapped and unmapped, never cached in the heap), a fixed trim threshold, and two malloc arenas —
  the operator's few threads (OTel export, metrics shutdown) need no arena of their own each.
- `HeapTrimmer`: `malloc_trim(0)` every `interval` seconds, which returns the free pages inside the
  heap as well. It runs in a worker thread (ctypes releases the GIL for the call): a first trim after a
  large list takes tens of milliseconds, which the event loop must not wait for.

And one that is not glibc's: asyncio gives every TLS connection a 256 KiB read buffer for its whole
life (`asyncio.sslproto.SSLProtocol.max_size`), and the operator keeps one connection open per watch
(nodes, pods, NodeWrights, policies, budgets, ...) — over 1 MiB of an idle operator's memory.
`shrink_tls_read_buffers()` lowers it to 64 KiB. A TLS record carries at most 16 KiB, so a read
still takes several records at a time; a large list page only takes a few more `read` calls.

And one that is OpenSSL's: aiohttp builds two default client contexts when it is imported, and both
load the system's CA bundle (`set_default_verify_paths`: ~140 certificates parsed into each context's
store), ~1.4 MiB of an idle operator that it never uses — the API server's context carries the
cluster's CA alone (`kube.config`) and notification sinks get a context of their own, built on their
first delivery (`controller.notify`). `import_http_client()` imports aiohttp with OpenSSL's default CA
*file* (`SSL_CERT_FILE`) pointed at an empty one for the import alone: those two contexts keep
OpenSSL's default CA directory only, which it reads one issuer at a time when a certificate is
verified, never at import.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import ctypes
import ctypes.util
import functools
import os
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

# mallopt(3) parameters (glibc malloc.h).
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

# glibc's own default mmap threshold, held fixed instead of growing up to 32 MiB.
MMAP_THRESHOLD_BYTES: Final = 128 * 1024
TRIM_THRESHOLD_BYTES: Final = 128 * 1024
ARENAS: Final = 2
TRIM_INTERVAL_SECONDS: Final = 30.0
TLS_READ_BUFFER_BYTES: Final = 64 * 1024


# OpenSSL's environment variable for its default CA file (`ssl.get_default_verify_paths()`).
CA_FILE_ENV: Final = "SSL_CERT_FILE"


class Allocator(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...
    def malloc_trim(self, pad: int) -> int: ...


def glibc() -> Allocator | None:
    """The process's C library if it is glibc (it has `malloc_trim`), else None (musl, macOS)."""
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def tune_allocator(allocator: Allocator | None) -> bool:
    """Fix glibc's thresholds and arena count; True if every setting was accepted."""
    if allocator is None:
        return False
    accepted = [
        allocator.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        allocator.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        allocator.mallopt(M_ARENA_MAX, ARENAS),
    ]
    return all(result == 1 for result in accepted)


def shrink_tls_read_buffers(size: int = TLS_READ_BUFFER_BYTES) -> int:
    """Make asyncio's TLS connections opened from now on read into `size`-byte buffers; returns the
    previous size."""
    if size < 16 * 1024:
        raise ValueError("a TLS read buffer must hold at least one 16 KiB record")
    protocol = asyncio.sslproto.SSLProtocol
    previous = int(protocol.max_size)
    protocol.max_size = size
    return previous


def import_http_client() -> bool:
    """Import aiohttp without its default contexts loading a CA bundle; True if that was done (False:
    aiohttp was imported already)."""
    if "aiohttp" in sys.modules:
        return False
    # Before any thread starts (the environment is the process's), and put back at once: contexts
    # built later, such as the notification sinks', load the CA file as usual (the environment's own
    # SSL_CERT_FILE if it names one).
    named = os.environ.get(CA_FILE_ENV)
    os.environ[CA_FILE_ENV] = os.devnull
    try:
        import aiohttp  # noqa: F401  (builds its default client contexts at import)
    finally:
        if named is None:
            del os.environ[CA_FILE_ENV]
        else:
            os.environ[CA_FILE_ENV] = named
    return True


@functools.cache
def system_tls_context() -> ssl.SSLContext:
    """The system's CA store, for the operator's HTTPS calls outside the cluster (notification sinks,
    health gates' Prometheus). Built on first use, once: aiohttp's own default context has no CA file in
    the operator (`import_http_client`), so every such call passes this one as `ssl=`."""
    return ssl.create_default_context()


class HeapTrimmer:
    """Returns the heap's free pages to the kernel every `interval` seconds while it runs.

    `allocator` is `glibc()`; None (another C library) makes every method a no-op.
    """

    def __init__(
        self,
        allocator: Allocator | None,
        *,
        interval: float = TRIM_INTERVAL_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._interval = interval
        self._allocator = allocator
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._allocator is not None

    def trim(self) -> bool:
        """One `malloc_trim(0)`; True if glibc released memory."""
        if self._allocator is None:
            return False
        self.trims += 1
        return bool(self._allocator.malloc_trim(0))

    async def run(self) -> None:
        while True:
            await self._sleep(self._interval)
            await asyncio.to_thread(self.trim)

    def start(self) -> asyncio.Task[None] | None:
        if self._allocator is None:
            return None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="heap-trim")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
