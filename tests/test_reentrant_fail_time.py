"""A re-entrant Lock's acquire against a server that stopped answering fails within about one
`command_timeout`, the first one and each one after it, as the plain Lock's does.

Before, the asyncio API (whose re-entrant calls go through the runtime) took twice as long from
the second failure on: the give-back of the attempt before (the count set back, or the claim
given back) was connecting meanwhile, and the call waited for that connect to fail, then
connected itself; a re-entry also waited for the count step's turn that the give-back held while
it connected. `connect_timeout` equals `command_timeout` here, so twice either shows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redmutex
import redmutex.aio
from _proxy import FaultProxy
from redmutex._server import RedisServer

TIMEOUT = 1.0
# Well below two timeouts, well above one on a loaded machine.
BOUND = 1.6 * TIMEOUT
TRIES = 3


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def _failed_within(times: list[float]) -> None:
    print("\nfailed after", ", ".join(f"{t:.3f} s" for t in times))
    assert all(t < BOUND for t in times), f"a failing acquire took {max(times):.3f} s"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["first", "reentry"])
def test_aio_reentrant_acquire_fails_within_one_timeout(
    proxy: FaultProxy, prefix: str, case: str
) -> None:
    c = redmutex.Client(proxy.url, prefix=prefix, connect_timeout=TIMEOUT, command_timeout=TIMEOUT)

    async def main() -> list[float]:
        lock = redmutex.aio.Lock(c, f"fail-time-aio-{case}", ttl=30, reentrant=True)
        for _ in range(2):  # connections open, scripts loaded
            assert await lock.acquire(timeout=0)
            assert await lock.acquire(timeout=0)
            await lock.release()
            await lock.release()
        if case == "reentry":
            assert await lock.acquire(timeout=0)
        proxy.blackhole("both")
        times = []
        for _ in range(TRIES):
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError):
                await lock.acquire(timeout=0)
            times.append(time.monotonic() - started)
        return times

    try:
        _failed_within(asyncio.run(main()))
    finally:
        proxy.heal()
        c.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["first", "reentry"])
def test_blocking_reentrant_acquire_fails_within_one_timeout(
    proxy: FaultProxy, prefix: str, case: str
) -> None:
    c = redmutex.Client(proxy.url, prefix=prefix, connect_timeout=TIMEOUT, command_timeout=TIMEOUT)
    try:
        lock = redmutex.Lock(c, f"fail-time-sync-{case}", ttl=30, reentrant=True)
        for _ in range(2):
            assert lock.acquire(timeout=0)
            assert lock.acquire(timeout=0)
            lock.release()
            lock.release()
        if case == "reentry":
            assert lock.acquire(timeout=0)
        proxy.blackhole("both")
        times = []
        for _ in range(TRIES):
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError):
                lock.acquire(timeout=0)
            times.append(time.monotonic() - started)
        _failed_within(times)
    finally:
        proxy.heal()
        c.close()
