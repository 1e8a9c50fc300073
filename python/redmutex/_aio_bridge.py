"""One `_core.LoopWaker` per event loop: the Rust runtime queues finished operations there and
wakes the loop through a socket, so only the loop's own thread ever touches their futures."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from ._core import LoopWaker

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


_opening: set[asyncio.Task[None]] = set()


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
        try:
            if path is not None:
                opening = loop.create_unix_connection(lambda: protocol, path)
            else:
                opening = loop.create_connection(lambda: protocol, host, port)
            await asyncio.wait_for(opening, timeout)
        except (OSError, asyncio.TimeoutError, ValueError):
            protocol._connect_failed()

    task = loop.create_task(run())
    _opening.add(task)
    task.add_done_callback(_opening.discard)
