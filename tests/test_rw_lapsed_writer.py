"""A reader held back by a waiting writer, when that writer then takes the write lock and its
lease runs out without a release (the writer hung or died). Contract: a lease that expires
without a release is noticed when it ends, so the reader gets in about when the writer's lease
ends.

A reader held back by a waiting writer's place is told to look again when that place lapses (up
to 6 s later); the writer then took the lock from its place with nobody told, so the reader
slept on. Before the fix the reader got in about 4.9 s after the writer's lease ended, in 4 of 4
blocking runs and 2 of 2 asyncio runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import redis
import redmutex
from _helpers import ResultThread, wait_until
from redmutex import aio

WRITER_TTL = 0.5
# A reader that was not told sleeps until the writer's place lapses, about 5 s after its lease;
# one told gets in at once, plus whatever a starved machine adds (2.9 s seen under 3 burners).
LATE_BOUND = 3.0
RUNS = 3


def _placed(r: redis.Redis, waiting: bytes) -> Callable[[], bool]:
    return lambda: int(r.zcard(waiting)) == 1


def test_a_held_back_reader_gets_in_when_the_unreleased_writers_lease_ends(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    lates = []
    kept: list[redmutex.RWLockSide] = []  # the writer's hold stays referenced: it must run out
    for run in range(RUNS):
        name = f"lapsed-writer-{run}"
        first = redmutex.RWLock(client, name, ttl=10).read()
        assert first.acquire(timeout=5)
        writer = redmutex.RWLock(client, name, ttl=WRITER_TTL).write()
        kept.append(writer)
        took: list[float] = []

        def write(writer: redmutex.RWLockSide = writer, took: list[float] = took) -> None:
            assert writer.acquire(timeout=15)
            took.append(time.monotonic())  # ...and never released

        def read(name: str = name) -> float:
            reader = redmutex.RWLock(client, name, ttl=10).read()
            assert reader.acquire(timeout=20)
            at = time.monotonic()
            reader.release()
            return at

        writing = threading.Thread(target=write)
        writing.start()
        wait_until(_placed(r, key_of(name, "rw:writers_waiting")), 10, "the writer's place")
        reading = ResultThread(read)
        reading.start()
        time.sleep(0.5)  # the reader looks, and is held back by the writer's place
        first.release()  # the writer takes the write lock from its place
        writing.join(15)
        got_in = reading.outcome(30)
        lates.append(got_in - (took[0] + WRITER_TTL))
    assert all(late < LATE_BOUND for late in lates), lates


def test_a_held_back_aio_reader_gets_in_when_the_unreleased_writers_lease_ends(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    async def run_once(name: str) -> float:
        first = aio.RWLock(client, name, ttl=10).read()
        assert await first.acquire(timeout=5)
        writer = aio.RWLock(client, name, ttl=WRITER_TTL).write()
        took: list[float] = []

        async def write() -> None:
            assert await writer.acquire(timeout=15)
            took.append(time.monotonic())  # ...and never released

        async def read() -> float:
            reader = aio.RWLock(client, name, ttl=10).read()
            assert await reader.acquire(timeout=20)
            at = time.monotonic()
            await reader.release()
            return at

        writing = asyncio.create_task(write())
        waiting = key_of(name, "rw:writers_waiting")
        for _ in range(1000):
            if _placed(r, waiting)():
                break
            await asyncio.sleep(0.01)
        reading = asyncio.create_task(read())
        await asyncio.sleep(0.5)
        await first.release()
        await asyncio.wait_for(writing, 15)
        got_in = await asyncio.wait_for(reading, 30)
        return got_in - (took[0] + WRITER_TTL)

    async def main() -> list[float]:
        return [await run_once(f"lapsed-writer-aio-{run}") for run in range(RUNS)]

    lates = asyncio.run(main())
    assert all(late < LATE_BOUND for late in lates), lates
