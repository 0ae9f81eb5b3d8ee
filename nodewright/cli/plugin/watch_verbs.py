"""`watch [NW]`: a live full-screen view of rollouts -- the screen `make demo` prints, for any cluster.

Every `--interval` seconds: one read of nodes, NodeWrights and policies (`cluster.read_state`), the
planner run per NodeWright (`explain`), the newest Events of each NodeWright (field-selected by the API
server), then the screen (`view.screen`) drawn on the terminal's alternate screen, sized to it. Ctrl-C
ends it and restores the terminal. Without a terminal (or with `--once`) frames are printed one
after the other, which is also what scripts and tests read.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from typing import Any

from nodewright.cli.plugin import common

JSON = dict[str, Any]
ENTER, LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
HOME_CLEAR = "\x1b[H\x1b[2J"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "watch",
        help="live full-screen progress of NodeWrights",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else "",
        examples=["kubectl nodewright watch", "kubectl nodewright watch gpu-drivers --interval 5"],
    )
    parser.add_argument("nodewright", nargs="?", help="one NodeWright (default: all)")
    parser.add_argument(
        "--interval", type=common.positive_seconds, default=2.0, metavar="SECONDS", help="refresh (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument(
        "--events", type=int, default=4, metavar="N", help="recent Events per NodeWright (default 4)"
    )
    common.add_cluster_flags(parser)
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _run)


async def frame(client: Any, name: str | None, *, events: int) -> tuple[list[JSON], dict[str, list[JSON]]]:
    """The documents of one frame: `status_doc` per NodeWright and its newest Events (also `make demo`'s)."""
    from nodewright.cli.plugin.cluster import read_state, recent_events
    from nodewright.cli.plugin.explain import analyse
    from nodewright.cli.plugin.status_verbs import status_doc

    state = await read_state(client)
    names = [name] if name else sorted(state.nodewrights)
    if name:
        state.nodewright(name)
    docs = [status_doc(analyse(state, n)) for n in names]
    news: dict[str, list[JSON]] = {}
    if events > 0:
        for n in names:
            news[n] = await recent_events(client, kind="NodeWright", name=n, limit=events)
    return docs, news


async def _run(session: common.Session) -> int:
    from nodewright.cli.plugin.view import screen

    args = session.args
    tty = sys.stdout.isatty() and not args.once
    started = time.monotonic()
    if tty:
        sys.stdout.write(ENTER)
    try:
        while True:
            docs, news = await frame(session.client, args.nodewright, events=args.events)
            size = shutil.get_terminal_size((120, 40))
            lines = screen(
                docs,
                events=news,
                elapsed=time.monotonic() - started,
                width=size.columns,
                height=size.lines if tty else None,
                footer="Ctrl-C to quit" if tty else "",
            )
            if tty:
                sys.stdout.write(HOME_CLEAR + "\n".join(lines))
            else:
                sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
            if args.once:
                return common.OK
            await asyncio.sleep(args.interval)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return common.OK
    finally:
        if tty:
            sys.stdout.write(LEAVE)
            sys.stdout.flush()
