"""The stampede-safe cache (`get_or_fill`, `@cached`, `redmutex.aio`) on a 3-master Redis Cluster:
keys on every master, one fill for a stampede, invalidation, a fill that raises, XFetch."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redmutex
from _scale_servers import Cluster
from redis.crc import key_slot
from redmutex import aio
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)

PREFIX = "cc:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[redmutex.Client]:
    c = cluster.client(PREFIX)
    try:
        yield c
    finally:
        c.close()


def value_key(key: str) -> str:
    return f"{PREFIX}{{{key}}}:value"


def owner_of(cluster: Cluster, key: str) -> RedisServer:
    return cluster.owner(int(key_slot(value_key(key).encode())))


def key_on(cluster: Cluster, index: int, tag: str) -> str:
    """A fresh cache key whose slot belongs to master `index`."""
    server = cluster.servers[index]
    base = f"{tag}{uuid.uuid4().hex[:8]}-"
    return next(f"{base}{i}" for i in range(100_000) if owner_of(cluster, f"{base}{i}") is server)


def stored(cluster: Cluster, key: str) -> bool:
    with cluster.conn(owner_of(cluster, key)) as r:
        return bool(r.exists(value_key(key)))


def test_keys_on_every_master_fill_hit_and_invalidate(
    cluster: Cluster, client: redmutex.Client
) -> None:
    keys = [key_on(cluster, i, "every") for i in range(3)]
    fills: list[str] = []

    def fill_for(key: str) -> str:
        fills.append(key)
        return f"value of {key}"

    for key in keys:
        assert redmutex.get_or_fill(client, key, lambda k=key: fill_for(k), ttl=30) == (  # type: ignore[misc]
            f"value of {key}"
        )
        assert stored(cluster, key)
        # A hit: served from the master that owns the key, no second fill.
        assert redmutex.get_or_fill(client, key, lambda: "again", ttl=30) == f"value of {key}"
    assert fills == keys

    calls: list[str] = []

    @redmutex.cached(client, ttl=30, key="user:{user}")
    def load(user: str) -> str:
        calls.append(user)
        return f"{user}#{len(calls)}"

    # One user whose key ("user:<user>") is on each master.
    users = [key_on(cluster, i, "user:").removeprefix("user:") for i in range(3)]
    for n, user in enumerate(users, 1):
        assert load(user) == f"{user}#{n}"
        assert stored(cluster, f"user:{user}")
    assert load(users[0]) == f"{users[0]}#1"  # a hit
    assert load.invalidate(users[1]) is True
    assert not stored(cluster, f"user:{users[1]}")
    assert load.invalidate(users[1]) is False
    assert load(users[1]) == f"{users[1]}#4"  # filled anew
    assert load(users[2]) == f"{users[2]}#3"  # the others untouched


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_stampede_of_threads_fills_once(
    cluster: Cluster, client: redmutex.Client, index: int
) -> None:
    key = key_on(cluster, index, "stampede")
    n, fill_s = 16, 0.3
    fills: list[float] = []
    barrier = threading.Barrier(n)
    results: list[tuple[object, float]] = []
    errors: list[BaseException] = []

    def fill() -> str:
        fills.append(time.monotonic())
        time.sleep(fill_s)
        return "filled"

    def call() -> None:
        try:
            barrier.wait(10)
            started = time.monotonic()
            value = redmutex.get_or_fill(client, key, fill, ttl=30, timeout=20)
            results.append((value, time.monotonic() - started))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=call, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not errors, errors
    assert len(fills) == 1
    assert [v for v, _ in results] == ["filled"] * n
    # The waiters were woken by the store, not by a timer or the claim's end.
    assert max(took for _, took in results) < fill_s + 3


def test_a_stampede_of_tasks_fills_once(cluster: Cluster, client: redmutex.Client) -> None:
    key = key_on(cluster, 2, "aio-stampede")
    fills: list[int] = []

    async def fill() -> str:
        fills.append(1)
        await asyncio.sleep(0.3)
        return "filled"

    async def main() -> list[object]:
        calls = [aio.get_or_fill(client, key, fill, ttl=30, timeout=20) for _ in range(16)]
        return list(await asyncio.wait_for(asyncio.gather(*calls), 30))

    started = time.monotonic()
    assert asyncio.run(main()) == ["filled"] * 16
    assert len(fills) == 1
    assert time.monotonic() - started < 0.3 + 3


def test_a_fill_that_raises_hands_over_to_one_waiter(
    cluster: Cluster, client: redmutex.Client
) -> None:
    key = key_on(cluster, 1, "raises")
    started, go = threading.Event(), threading.Event()
    fills: list[str] = []
    outcomes: list[object] = []

    def failing() -> str:
        fills.append("failing")
        started.set()
        go.wait(10)
        raise RuntimeError("fill failed")

    def taking_over() -> str:
        fills.append("taking over")
        return "second"

    def first() -> None:
        try:
            redmutex.get_or_fill(client, key, failing, ttl=30, timeout=20)
        except RuntimeError as exc:
            outcomes.append(exc)

    def waiter() -> None:
        outcomes.append(redmutex.get_or_fill(client, key, taking_over, ttl=30, timeout=20))

    filler = threading.Thread(target=first, daemon=True)
    filler.start()
    assert started.wait(10)
    waiters = [threading.Thread(target=waiter, daemon=True) for _ in range(3)]
    for t in waiters:
        t.start()
    time.sleep(0.3)
    go.set()
    for t in [filler, *waiters]:
        t.join(30)
    assert fills == ["failing", "taking over"]
    assert sorted(map(str, outcomes)) == ["fill failed", "second", "second", "second"]


def test_xfetch_refreshes_before_expiry_on_the_keys_master(
    cluster: Cluster, client: redmutex.Client
) -> None:
    # A 1 s value read in a loop by 3 threads for 3.5 s: early refreshes keep it there (it is
    # never missing on its master after the first store), one refresh at a time.
    key = key_on(cluster, 0, "xfetch")
    ttl, run_s = 1.0, 3.5
    fills: list[int] = []
    running = [0]
    overlaps: list[int] = []
    guard = threading.Lock()

    def fill() -> int:
        with guard:
            running[0] += 1
            overlaps.append(running[0])
        time.sleep(0.1)
        with guard:
            running[0] -= 1
            fills.append(len(fills) + 1)
            return len(fills)

    stop = time.monotonic() + run_s
    gaps: list[float] = []
    values: list[object] = []

    def monitor(r: redis.Redis) -> None:
        seen = False
        while time.monotonic() < stop:
            if r.exists(value_key(key)):
                seen = True
            elif seen:
                gaps.append(time.monotonic())
            time.sleep(0.005)

    def reader() -> None:
        while time.monotonic() < stop:
            values.append(redmutex.get_or_fill(client, key, fill, ttl=ttl, beta=1.0, timeout=10))
            time.sleep(0.002)

    with cluster.conn(owner_of(cluster, key)) as r:
        watcher = threading.Thread(target=monitor, args=(r,), daemon=True)
        readers = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
        for t in [watcher, *readers]:
            t.start()
        for t in [watcher, *readers]:
            t.join(run_s + 30)
    assert not gaps, f"the value was missing at {len(gaps)} samples"
    assert len(fills) >= 3, fills  # the first fill and at least two early refreshes
    assert max(overlaps) == 1
    assert len(values) > 100
    assert set(values) == set(fills)  # every generation was served, nothing else
