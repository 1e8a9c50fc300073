"""Fences without a permanent key (API.md, "Key layout"): the fencing counter expires
`fence_ttl` seconds after the last acquisition, and a counter created afresh starts from the
Redis server's clock in µs, so a name's fences keep strictly increasing across the expiry."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from redmutex import aio

if TYPE_CHECKING:
    from conftest import PyProcs


def _server_us(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1_000_000 + int(micros)


def _keys_of(r: redis.Redis, prefix: str, name: str) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{prefix}{{{name}}}*"))


def test_the_default_is_a_day(redis_url: str) -> None:
    assert redmutex.Client(redis_url).fence_ttl == 86400.0
    assert redmutex.Client(redis_url, fence_ttl=2.5).fence_ttl == 2.5


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, 10**30])
def test_a_bad_fence_ttl_is_a_value_error_naming_it(redis_url: str, bad: object) -> None:
    with pytest.raises(ValueError, match="fence_ttl"):
        redmutex.Client(redis_url, fence_ttl=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, 0.0, -1, 0.0001, 0.0009])
def test_a_fence_ttl_under_a_millisecond_is_refused_with_the_bound_of_every_lease(
    redis_url: str, bad: float
) -> None:
    """The rule of `ttl` (>= 0.001 s, API.md), in one message for every value under it. Before:
    0 said "greater than 0", -1 "at least 0 seconds", and 0.0001 became 0.001 silently."""
    with pytest.raises(ValueError, match=r"fence_ttl: must be at least 0\.001 seconds"):
        redmutex.Client(redis_url, fence_ttl=bad)
    assert redmutex.Client(redis_url, fence_ttl=0.001).fence_ttl == 0.001


@pytest.mark.parametrize("bad", ["60", True, [1], object()])
def test_a_fence_ttl_of_another_type_is_a_type_error_naming_it(redis_url: str, bad: object) -> None:
    with pytest.raises(TypeError, match="fence_ttl"):
        redmutex.Client(redis_url, fence_ttl=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("fair", [False, True])
def test_a_fresh_counter_starts_from_the_server_clock_and_expires(
    redis_url: str, prefix: str, r: redis.Redis, fair: bool
) -> None:
    client = redmutex.Client(redis_url, prefix=prefix, fence_ttl=30)
    name = f"fresh-{fair}"
    before = _server_us(r)
    with redmutex.Lock(client, name, ttl=5, fair=fair) as lock:
        assert lock.fence is not None
        assert before <= lock.fence <= _server_us(r)
        fence_key = f"{prefix}{{{name}}}:fence"
        assert int(r.get(fence_key) or 0) == lock.fence
        assert 0 < r.pttl(fence_key) <= 30_000


@pytest.mark.parametrize("fair", [False, True])
def test_an_idle_name_leaves_no_key_and_fences_still_increase(
    redis_url: str, prefix: str, r: redis.Redis, fair: bool
) -> None:
    client = redmutex.Client(redis_url, prefix=prefix, fence_ttl=0.3)
    name = f"idle-{fair}"
    fences = []
    for _ in range(3):
        lock = redmutex.Lock(client, name, ttl=5, fair=fair)
        with lock:
            fences.append(lock.fence)
        with lock:  # back to back: the counter is still there
            fences.append(lock.fence)
        deadline = time.monotonic() + 5
        while _keys_of(r, prefix, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _keys_of(r, prefix, name) == [], "the idle name kept a key"
    assert all(isinstance(f, int) for f in fences)
    assert fences == sorted(fences) and len(set(fences)) == len(fences), fences


def test_a_fair_grant_on_release_refreshes_the_counter(
    redis_url: str, prefix: str, r: redis.Redis
) -> None:
    client = redmutex.Client(redis_url, prefix=prefix, fence_ttl=20)
    holder = redmutex.Lock(client, "granted", ttl=10, fair=True)
    waiter = redmutex.Lock(client, "granted", ttl=10, fair=True)
    assert holder.acquire(timeout=5)
    first = holder.fence
    assert first is not None
    fence_key = f"{prefix}{{granted}}:fence"
    r.pexpire(fence_key, 2_000)  # as if the counter had been idle for a while
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    deadline = time.monotonic() + 10
    while r.hlen(f"{prefix}{{granted}}:lock:queue") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    holder.release()  # grants the lock to the waiter, issuing its fence in Redis
    thread.join(20)
    assert got == [True]
    assert waiter.fence is not None and waiter.fence > first
    assert 10_000 < r.pttl(fence_key) <= 20_000
    waiter.release()


def test_asyncio_locks_use_the_same_counter(redis_url: str, prefix: str, r: redis.Redis) -> None:
    client = redmutex.Client(redis_url, prefix=prefix, fence_ttl=10)

    async def main() -> None:
        lock = aio.Lock(client, "aio", ttl=5)
        async with lock:
            first = lock.fence
        assert 0 < r.pttl(f"{prefix}{{aio}}:fence") <= 10_000
        async with lock:
            assert lock.fence is not None and first is not None and lock.fence > first

    asyncio.run(main())


_CHILD = """
import sys, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2], fence_ttl=0.3)
with redmutex.Lock(client, "procs", ttl=5, fair=sys.argv[3] == "1") as lock:
    print(lock.fence)
"""


@pytest.mark.parametrize("fair", [False, True])
def test_fences_increase_across_processes_and_expiries(
    redis_url: str, prefix: str, r: redis.Redis, procs: PyProcs, fair: bool
) -> None:
    fences = []
    for _ in range(3):
        code, out, err = procs.run(_CHILD, redis_url, prefix, "1" if fair else "0", timeout=60)
        assert code == 0, err
        fences.append(int(out))
        deadline = time.monotonic() + 5
        while _keys_of(r, prefix, "procs") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _keys_of(r, prefix, "procs") == []
    assert fences == sorted(fences) and len(set(fences)) == 3, fences
