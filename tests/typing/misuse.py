"""Misuses that the type checkers must reject (tests/test_typing.py expects one error per line
marked with an `E:` comment). Never run."""

from __future__ import annotations

import redmutex
from redmutex import aio


async def misuse() -> None:
    aio.Lock(42, "x")  # E: a client is not an int
    aio.Semaphore(object(), "x", 3)  # E: nor any object
    aio.RWLock(b"redis://h", "x")  # E: nor bytes
    redmutex.Lock(42, "x")  # E: the sync classes too
    redmutex.get_or_fill(3.5, "k", lambda: 1, ttl=1)  # E: and the cache
    await aio.get_or_fill(None, "k", lambda: 1, ttl=1)  # E: and the aio cache
    redmutex.acquire_lock(42, "name")  # E: and the recipes
    redmutex.Lock("redis://h", "x", ttl="10")  # E: a ttl is a float
    mode: int = aio.RWLock("redis://h", "x").read().mode  # E: mode is a Literal str
    aio.locked("redis://h", "x")(len)  # E: aio.locked takes async functions only
    del mode
