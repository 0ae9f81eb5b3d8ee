"""Network namespaces from Python: create one, and open sockets inside it while the process stays outside.

Linux binds a socket to the network namespace of the thread that created it, for its whole life: a
socket made while the thread is in namespace B listens or connects in B even after the thread has gone
back to A. So one process (the simulator's `realnodes` component) can accept connections inside the
real nodes' lab network and open the matching ones to 127.0.0.1 on the machine, with no address, route
or firewall rule added to the machine's own namespace. CPython 3.11 has no `os.setns`/`os.unshare`, so
both are called from libc through ctypes; they act on the calling thread only, which is why every switch
is undone before the function returns (`inside`).

Requires root (CAP_SYS_ADMIN). Nothing here changes the machine's namespace: `new_namespace` leaves the
calling thread where it was and returns a file descriptor that keeps the new namespace alive until it
is closed and no process uses it any more.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Iterator
from typing import Final

CLONE_NEWNET: Final = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def current() -> int:
    """A file descriptor of the calling thread's network namespace (the caller closes it)."""
    return os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def new_namespace() -> int:
    """Create a network namespace and return a descriptor of it; the calling thread stays where it was."""
    home = current()
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        created = current()
        _check(_libc.setns(home, CLONE_NEWNET), "setns back to the original namespace")
    finally:
        os.close(home)
    return created


@contextlib.contextmanager
def inside(namespace: int) -> Iterator[None]:
    """Run the body with the calling thread in `namespace`, then return to where it was."""
    home = current()
    try:
        _check(_libc.setns(namespace, CLONE_NEWNET), "setns")
        try:
            yield
        finally:
            _check(_libc.setns(home, CLONE_NEWNET), "setns back to the original namespace")
    finally:
        os.close(home)


def tcp_socket(namespace: int) -> socket.socket:
    """A non-blocking IPv4 TCP socket that lives in `namespace`."""
    with inside(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def path(namespace: int) -> str:
    """A path naming `namespace` for other programs (`nsenter --net=PATH`) while this process holds it."""
    return f"/proc/{os.getpid()}/fd/{namespace}"
