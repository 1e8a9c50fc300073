"""One `_core.LoopWaker` per event loop: the Rust runtime queues finished operations there and
wakes the loop through a socket, so only the loop's own thread ever touches their futures."""

from __future__ import annotations

import asyncio
import weakref

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
