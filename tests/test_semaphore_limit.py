"""A Semaphore's limit is kept with it in Redis (API.md, "Semaphore"): an acquire whose limit
differs from the live one raises SemaphoreLimitError (a LockError) naming both limits; a new
limit takes effect once no holder or waiter of the old one remains (an unfair waiter too: it
keeps a place in Redis while it waits, though it takes no turn by it)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from redmutex import aio
from redmutex.errors import SemaphoreLimitError

if TYPE_CHECKING:
    from conftest import PyProcs


def test_the_error_is_exported_and_a_lock_error() -> None:
    assert redmutex.SemaphoreLimitError is SemaphoreLimitError
    assert "SemaphoreLimitError" in redmutex.__all__
    assert issubclass(SemaphoreLimitError, redmutex.LockError)


@pytest.mark.parametrize("fair", [False, True])
def test_another_limit_is_refused_while_the_old_one_has_holders(
    client: redmutex.Client, r: redis.Redis, prefix: str, fair: bool
) -> None:
    one = redmutex.Semaphore(client, "s", 1, ttl=10, fair=fair)
    five = redmutex.Semaphore(client, "s", 5, ttl=10, fair=fair)
    assert one.acquire(timeout=0)
    started = time.monotonic()
    with pytest.raises(SemaphoreLimitError) as caught:
        five.acquire(timeout=5)  # refused at once, not after waiting
    assert time.monotonic() - started < 3
    message = str(caught.value)
    assert "'s'" in message and "limit 5" in message and "limit 1" in message, message
    assert message.count("semaphore 's'") == 1, message  # named once
    assert five.holders() == 1 and five.token is None
    with pytest.raises(SemaphoreLimitError), five:
        pass
    # The same limit: just busy.
    assert redmutex.Semaphore(client, "s", 1, fair=fair).acquire(timeout=0) is False
    one.release()
    # No holder of the old limit remains: the new one takes effect, and refuses the old.
    assert five.acquire(timeout=0)
    with pytest.raises(SemaphoreLimitError, match="limit 1"):
        one.acquire(timeout=0)
    others = [redmutex.Semaphore(client, "s", 5, fair=fair) for _ in range(4)]
    assert all(s.acquire(timeout=0) for s in others)
    assert redmutex.Semaphore(client, "s", 5, fair=fair).acquire(timeout=0) is False
    for s in [five, *others]:
        s.release()
    # Nothing is left behind.
    assert list(r.scan_iter(match=f"{prefix}{{s}}*")) == []


def test_a_queued_waiter_keeps_the_old_limit_live(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    holder = redmutex.Semaphore(client, "q", 1, ttl=10)
    assert holder.acquire(timeout=0)
    waiter = redmutex.Semaphore(client, "q", 1, ttl=10)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    deadline = time.monotonic() + 10
    while r.llen(f"{prefix}{{q}}:sem:queue") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    holder.release()  # the waiter gets the permit: still the old limit
    thread.join(20)
    assert got == [True]
    with pytest.raises(SemaphoreLimitError):
        redmutex.Semaphore(client, "q", 3).acquire(timeout=0)
    waiter.release()
    three = redmutex.Semaphore(client, "q", 3)
    assert three.acquire(timeout=0)
    three.release()


def test_an_unfair_waiter_keeps_the_old_limit_live(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    holder = redmutex.Semaphore(client, "u", 1, ttl=10, fair=False)
    assert holder.acquire(timeout=0)
    waiter = redmutex.Semaphore(client, "u", 1, ttl=10, fair=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    try:
        places = f"{prefix}{{u}}:sem:queue:deadlines"
        deadline = time.monotonic() + 10
        while r.zcard(places) == 0:  # the waiter's place: no turn, but a waiter of limit 1
            assert time.monotonic() < deadline, "the unfair waiter left no trace in Redis"
            time.sleep(0.01)
        holder.release()
        # At once, before the woken waiter looks again: its limit still holds.
        with pytest.raises(SemaphoreLimitError, match="limit 1"):
            redmutex.Semaphore(client, "u", 5, fair=False).acquire(timeout=0)
    finally:
        thread.join(20)
    assert got == [True]
    waiter.release()
    assert r.zcard(places) == 0  # admitted: its place is gone
    five = redmutex.Semaphore(client, "u", 5, fair=False)
    assert five.acquire(timeout=0)  # nobody of the old limit remains
    # A waiter that gives up takes its place along at once.
    with redmutex.Semaphore(client, "u", 5, ttl=10, fair=False) as other:
        assert other.holders() == 2
        more = [redmutex.Semaphore(client, "u", 5, ttl=10, fair=False) for _ in range(3)]
        assert all(m.acquire(timeout=0) for m in more)
        assert not redmutex.Semaphore(client, "u", 5, fair=False).acquire(timeout=0.5)
        assert r.zcard(places) == 0
        for m in more:
            m.release()
    five.release()
    assert list(r.scan_iter(match=f"{prefix}{{u}}*")) == []


@pytest.mark.parametrize("fair", [False, True])
def test_asyncio_semaphores_share_the_live_limit(client: redmutex.Client, fair: bool) -> None:
    async def main() -> None:
        one = aio.Semaphore(client, "a", 1, ttl=10, fair=fair)
        assert await one.acquire(timeout=0)
        with pytest.raises(SemaphoreLimitError, match="limit 5"):
            await aio.Semaphore(client, "a", 5, fair=fair).acquire(timeout=5)
        with pytest.raises(SemaphoreLimitError):
            async with aio.Semaphore(client, "a", 2, fair=fair):
                pass
        await one.release()
        two = aio.Semaphore(client, "a", 2, fair=fair)
        assert await two.acquire(timeout=0)
        await two.release()

    asyncio.run(main())


_HOLDER = """
import sys, time, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
sem = redmutex.Semaphore(client, "p", 1, ttl=30)
assert sem.acquire(timeout=10)
print("held", flush=True)
time.sleep(float(sys.argv[3]))
sem.release()
print("released", flush=True)
"""

_OTHER = """
import sys, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
try:
    got = redmutex.Semaphore(client, "p", 5, ttl=30).acquire(timeout=2)
    print("acquired" if got else "timeout")
except redmutex.SemaphoreLimitError as exc:
    print("refused:", exc)
"""


def test_two_processes_with_different_limits(redis_url: str, prefix: str, procs: PyProcs) -> None:
    holder = procs.start(_HOLDER, redis_url, prefix, "4")
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    code, out, err = procs.run(_OTHER, redis_url, prefix, timeout=60)
    assert code == 0, err
    assert out.startswith("refused:") and "limit 5" in out and "limit 1" in out, out
    code, _, err = procs.wait(holder, 60)
    assert code == 0, err
    code, out, err = procs.run(_OTHER, redis_url, prefix, timeout=60)
    assert code == 0, err
    assert out.strip() == "acquired", out
