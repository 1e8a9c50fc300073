"""One `_core.LoopWaker` per event loop: the Rust runtime queues finished operations there and
wakes the loop through a socket, so only the loop's own thread ever touches their futures.

The loop path (`_core.LoopConn`): each loop's own connection to a client's server, opened here
on first use, carries the one-round-trip steps with no runtime thread in the round trip."""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import AsyncIterator
from typing import Any

from ._core import LoopConn, LoopWaker

_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker] = (
    weakref.WeakKeyDictionary()
)


def waker_for(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The waker of `loop`, registered as a reader the first time (called on the loop's thread)."""
    waker = _wakers.get(loop)
    if waker is None:
        waker = LoopWaker()
        loop.add_reader(waker.fileno(), waker.drain)
        _wakers[loop] = waker
    return waker


class LoopProtocol(LoopConn, asyncio.BufferedProtocol):
    """The loop path's protocol: a `BufferedProtocol` (so that the transport reads into
    `get_buffer()` instead of making a new bytes object per read), all of it in `LoopConn`."""

    __slots__ = ()


_opening: set[asyncio.Task[None]] = set()
_closers = itertools.count()


async def _close_with_loop(protocol: Any) -> AsyncIterator[None]:
    try:
        yield
    finally:
        protocol._close()


def open_connection(
    loop: asyncio.AbstractEventLoop,
    protocol: Any,
    host: str | None,
    port: int | None,
    path: str | None,
    timeout: float,
) -> None:
    """Opens the loop's own connection for `protocol` (a `_core.LoopConn`) in the background;
    until it is ready, the runtime serves the loop's calls."""

    async def run() -> None:
        # Closed with the loop: `asyncio.run` (and other runners) close every async generator
        # that started on the loop before closing it.
        closer = _close_with_loop(protocol)
        await closer.__anext__()
        getattr(loop, "_redmutex_conns", {})[("closer", next(_closers))] = closer
        try:
            if path is not None:
                await asyncio.wait_for(loop.create_unix_connection(lambda: protocol, path), timeout)
            elif host is not None and port is not None:
                opening = loop.create_connection(lambda: protocol, host, port)
                await asyncio.wait_for(opening, timeout)
            else:
                protocol._connect_failed()
        except (OSError, asyncio.TimeoutError, ValueError):
            protocol._connect_failed()

    task = loop.create_task(run())
    _opening.add(task)
    task.add_done_callback(_opening.discard)
