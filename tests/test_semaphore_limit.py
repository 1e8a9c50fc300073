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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [5.0, None])
def test_another_limit_is_refused_at_once_beside_a_waiter_of_the_same_client(
    client: redmutex.Client, r: redis.Redis, prefix: str, timeout: float | None
) -> None:
    """An unfair waiter of limit 1 of this client waits; an acquire with limit 3 must not queue
    behind it in process (where its first attempt, the one that learns the live limit, was
    skipped): it raises SemaphoreLimitError naming both limits at once. Before, it returned
    False after its whole timeout, or with timeout=None raised only once the holder released
    (5 of 5 in the helper's script)."""
    name = f"beside-{timeout}"
    holder = redmutex.Semaphore(client, name, 1, ttl=10, fair=False)
    assert holder.acquire(timeout=0)
    waiter = redmutex.Semaphore(client, name, 1, ttl=10, fair=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    try:
        places = f"{prefix}{{{name}}}:sem:queue:deadlines"
        deadline = time.monotonic() + 10
        while r.zcard(places) == 0:  # the waiter competes (its place is in Redis)
            assert time.monotonic() < deadline, "the unfair waiter left no trace in Redis"
            time.sleep(0.01)
        begun = time.monotonic()
        other = redmutex.Semaphore(client, name, 3, ttl=10, fair=False)
        with pytest.raises(SemaphoreLimitError, match="limit 3 .* limit 1"):
            other.acquire(timeout=timeout)
        assert time.monotonic() - begun < 2.5  # not after a timeout or the holder's release
    finally:
        holder.release()
        thread.join(20)
    assert got == [True]
    waiter.release()


@pytest.mark.timeout(60)
def test_asyncio_another_limit_is_refused_at_once_beside_a_waiter(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """The asyncio side of the test above: a task of limit 3 beside a waiting task of limit 1."""

    async def main() -> None:
        holder = aio.Semaphore(client, "aio-beside", 1, ttl=10, fair=False)
        assert await holder.acquire(timeout=0)
        waiter = aio.Semaphore(client, "aio-beside", 1, ttl=10, fair=False)
        waiting = asyncio.ensure_future(waiter.acquire(timeout=20))
        places = f"{prefix}{{aio-beside}}:sem:queue:deadlines"
        deadline = time.monotonic() + 10
        while r.zcard(places) == 0:
            assert time.monotonic() < deadline, "the unfair waiter left no trace in Redis"
            await asyncio.sleep(0.01)
        begun = time.monotonic()
        try:
            with pytest.raises(SemaphoreLimitError, match="limit 3 .* limit 1"):
                await aio.Semaphore(client, "aio-beside", 3, fair=False).acquire(timeout=5)
            assert time.monotonic() - begun < 2.5
        finally:
            await holder.release()
        assert await waiting
        await waiter.release()

    asyncio.run(main())


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
