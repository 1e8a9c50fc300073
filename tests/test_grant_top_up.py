"""A waited-for Lock acquire is handed the lock by the release with a short lease (the grant), which
the hold then tops up to its ttl in the background. The lease a caller asked for must not depend
on whether it waited: an object dropped right after a waited acquire leaves the name held for its
ttl, as it would after an acquire that did not wait (a dropped object never releases).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable

import pytest
import redis
import redmutex
import redmutex.aio

KeyOf = Callable[[str, str], bytes]

TTL = 30.0
# The grant's lease is at most the waiter's time left plus a few seconds, and its top-up runs when
# half of that has passed: well within this bound, which stays far below the grant's end.
TOP_UP_BOUND = 12.0


def _wait_for_pttl_above(r: redis.Redis, key: bytes, floor_ms: int, within: float) -> int:
    end = time.monotonic() + within
    pttl = r.pttl(key)
    while pttl < floor_ms and time.monotonic() < end:
        time.sleep(0.1)
        pttl = r.pttl(key)
    return int(pttl)


def _hand_over_to_a_dropped_waiter(client: redmutex.Client, name: str, fair: bool) -> str:
    first = redmutex.Lock(client, name, ttl=TTL, fair=fair)
    assert first.acquire()
    tokens: list[str] = []

    def wait_and_drop() -> None:
        waiter = redmutex.Lock(client, name, ttl=TTL, fair=fair)
        assert waiter.acquire(timeout=10)
        assert waiter.token is not None
        tokens.append(waiter.token)
        del waiter
        gc.collect()

    thread = threading.Thread(target=wait_and_drop)
    thread.start()
    time.sleep(0.3)
    first.release()
    thread.join(15)
    assert not thread.is_alive() and tokens
    return tokens[0]


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_a_dropped_object_keeps_a_waited_for_lock_for_its_ttl(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, fair: bool
) -> None:
    name = f"dropped-grant-{fair}"
    token = _hand_over_to_a_dropped_waiter(client, name, fair)
    key = key_of(name, "lock")
    pttl = _wait_for_pttl_above(r, key, int((TTL - TOP_UP_BOUND - 3) * 1000), TOP_UP_BOUND)
    assert r.get(key) == token.encode()
    assert pttl > (TTL - TOP_UP_BOUND - 3) * 1000, f"lease left {pttl} ms, never topped up"
    r.delete(key)


def test_a_dropped_asyncio_object_keeps_a_waited_for_lock_for_its_ttl(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    name = "dropped-grant-aio"

    async def scenario() -> str:
        first = redmutex.aio.Lock(client, name, ttl=TTL)
        assert await first.acquire()

        async def wait_and_drop() -> str:
            waiter = redmutex.aio.Lock(client, name, ttl=TTL)
            assert await waiter.acquire(timeout=10)
            assert waiter.token is not None
            return waiter.token

        task = asyncio.create_task(wait_and_drop())
        await asyncio.sleep(0.3)
        await first.release()
        return await asyncio.wait_for(task, 15)

    token = asyncio.run(scenario())
    gc.collect()
    key = key_of(name, "lock")
    pttl = _wait_for_pttl_above(r, key, int((TTL - TOP_UP_BOUND - 3) * 1000), TOP_UP_BOUND)
    assert r.get(key) == token.encode()
    assert pttl > (TTL - TOP_UP_BOUND - 3) * 1000, f"lease left {pttl} ms, never topped up"
    r.delete(key)
