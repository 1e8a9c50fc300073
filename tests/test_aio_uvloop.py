"""`redmutex.aio` on uvloop, the event loop uvicorn and many asyncio services run on when it is
installed: the loop path (the loop's own connection, `_core.LoopConn`) serves the
one-round-trip steps there too, waiters are woken by a release, a cancelled in-flight acquire
gives its grant back, the cache fills once, and closing a loop closes its connection."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import redmutex
import uvloop
from _proxy import FaultProxy
from redmutex import aio
from redmutex._server import RedisServer
from test_aio_loop import PRIMITIVES, calls, free_within, warm

if TYPE_CHECKING:
    from conftest import PyProcs

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a uvloop loop, checked to be one."""

    async def checked() -> T:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        return await main

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(checked())


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port).start() as p:
        yield p


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(PRIMITIVES))
def test_the_loop_path_serves_uncontended_calls(client: redmutex.Client, kind: str) -> None:
    async def main() -> None:
        hold = PRIMITIVES[kind](client, f"uv-{kind}")
        await warm(hold)
        loop0, runtime0 = calls()
        for _ in range(20):
            assert await hold.acquire()
            assert await hold.owned()
            await hold.extend(20)
            await hold.release()
        assert calls() == (loop0 + 20 * 4, runtime0)

    run(main())


@pytest.mark.timeout(60)
def test_tasks_exclude_each_other_and_a_release_wakes_a_waiter(client: redmutex.Client) -> None:
    async def main() -> None:
        inside, overlaps, entries = 0, 0, 0

        async def worker() -> None:
            nonlocal inside, overlaps, entries
            for _ in range(5):
                async with aio.Lock(client, "uv-mutex", ttl=30, timeout=30):
                    inside += 1
                    overlaps += inside > 1
                    entries += 1
                    await asyncio.sleep(0.002)
                    inside -= 1

        await asyncio.gather(*(worker() for _ in range(10)))
        assert (entries, overlaps) == (50, 0)

        holder = aio.Lock(client, "uv-wake", ttl=30)
        waiter = aio.Lock(client, "uv-wake", ttl=30)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await holder.release()
        assert await waiting
        # Woken by the release, not by the 30 s lease's end (generous bound: a loaded machine).
        assert time.monotonic() - released < 3
        await waiter.release()

    run(main())


@pytest.mark.timeout(120)
def test_a_cancelled_in_flight_acquire_gives_the_lock_back(
    redis_server: RedisServer, proxy: FaultProxy, prefix: str
) -> None:
    """The acquire is out on the loop's connection (its reply slowed by the proxy) when its task
    is cancelled: a grant its reply brings is given back at once, not kept for the 30 s lease.
    Bounded: 15 rounds or 30 s."""

    async def main() -> None:
        slow = redmutex.Client(proxy.url, prefix=prefix)
        direct = redmutex.Client(redis_server.url, prefix=prefix)
        try:
            lock = aio.Lock(slow, "uv-cancel", ttl=30)
            other = aio.Lock(direct, "uv-cancel", ttl=30)
            await warm(lock)
            proxy.set_latency(0.03, "s2c")
            rounds, cancelled = 0, 0
            deadline = time.monotonic() + 30
            while rounds < 15 and time.monotonic() < deadline:
                rounds += 1
                task = asyncio.create_task(lock.acquire())
                await asyncio.sleep(0.01)
                task.cancel()
                try:
                    if await task:
                        await lock.release()
                except asyncio.CancelledError:
                    cancelled += 1
                assert await free_within(other), f"round {rounds}: the lock was kept"
                assert lock.token is None
            assert cancelled > 0
        finally:
            slow.close()
            direct.close()

    run(main())


@pytest.mark.timeout(60)
def test_the_cache_fills_once_for_many_tasks(client: redmutex.Client) -> None:
    async def main() -> list[int]:
        fills = 0

        async def fill() -> int:
            nonlocal fills
            fills += 1
            await asyncio.sleep(0.2)
            return 42

        values = await asyncio.gather(
            *(aio.get_or_fill(client, "uv-cache", fill, ttl=30) for _ in range(20))
        )
        assert fills == 1
        return values

    assert run(main()) == [42] * 20


# uvloop loops, each closed with a bare `loop.close()` after one use: each must close its loop
# connection (the count of the server's clients stays put).
UVLOOP_CLOSE = """
import asyncio, json, sys
import redis, redmutex, uvloop
from redmutex import aio

url = sys.argv[1]
r = redis.Redis.from_url(url)
client = redmutex.Client(url, prefix=sys.argv[2])

async def use() -> None:
    lock = aio.Lock(client, "uv-close", ttl=30)
    for _ in range(3):  # the loop connection opens in the background on first use
        assert await lock.acquire()
        await lock.release()
        await asyncio.sleep(0.05)

def count() -> int:
    return len(r.client_list())

uvloop.run(use())
before = count()
for _ in range(20):
    loop = uvloop.new_event_loop()
    loop.run_until_complete(use())
    loop.close()
after_bare = count()
for _ in range(10):
    uvloop.run(use())
after_run = count()
print(json.dumps({"before": before, "after_bare": after_bare, "after_run": after_run}))
r.close()
client.close()
"""


@pytest.mark.timeout(120)
def test_closing_a_uvloop_loop_closes_its_connection(
    redis_url: str, prefix: str, procs: PyProcs
) -> None:
    code, out, err = procs.run(UVLOOP_CLOSE, redis_url, prefix)
    assert code == 0, err
    counts = json.loads(out)
    assert counts["after_bare"] <= counts["before"] + 2, counts
    assert counts["after_run"] <= counts["before"] + 2, counts
    assert "Task was destroyed" not in err, err
    assert "Exception ignored" not in err, err
