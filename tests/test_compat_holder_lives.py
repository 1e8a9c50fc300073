"""redmutex.compat: a "no expiry" hold (redis-py timeout=None, python-redis-lock expire=None) is
kept for as long as its process lives and it is not released, whatever happens to the shim
object that took it (garbage-collected, its thread or task gone), as the originals keep their
key; a release through any shim object with the same token (or a reset) ends the renewal.

The renewed lease is shortened (NO_EXPIRY_LEASE, read at each acquire) so that a lapse would
show within a second or two; everything runs against a real redis-server."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from _helpers import in_a_forked_child, wait_until
from redis.exceptions import LockNotOwnedError
from redmutex.compat import _common, redis_py
from redmutex.compat import redis_lock as prl
from redmutex.compat.redis_py import _base
from redmutex.compat.redis_py import asyncio as redis_py_aio

#: The shortened renewed lease: renewed every 0.2 s, so it lapses 0.6 s after renewal stops.
LEASE = 0.6
#: How long a test lets pass to see that a hold outlives its object (over three leases).
OUTLIVE = 2.0


@pytest.fixture
def name() -> str:
    return f"hl-{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_base, "NO_EXPIRY_LEASE", LEASE)
    monkeypatch.setattr(prl, "NO_EXPIRY_LEASE", LEASE)


@pytest.fixture
def lost_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        yield caplog


def renewing(key: bytes) -> list[str]:
    """The tokens this process renews on `key` (the registry of held-without-expiry holds)."""
    return [token for (_where, k, token) in _common.renewing() if k == key]


def assert_outlives(r: redis.Redis, key: str, value: bytes) -> None:
    gc.collect()
    time.sleep(OUTLIVE)
    assert r.get(key) == value, "the hold ended while its process lives"
    assert 0 < r.pttl(key) <= LEASE * 1000


def assert_ended_quietly(r: redis.Redis, log: pytest.LogCaptureFixture, *keys: str) -> None:
    """Each key was released and its renewal forgotten: a renewal still running would find the
    key gone within a lease and log that it was lost."""
    for key in keys:
        assert r.get(key) is None
        assert renewing(key.encode()) == []
    time.sleep(LEASE)
    assert "was lost" not in log.text


# -- redis-py -------------------------------------------------------------------------------


def test_redis_py_hold_outlives_its_lock_object(
    r: redis.Redis, r2: redis.Redis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    redis_py.lock(r, name).acquire(token="tok-1")  # the object is dropped at once
    assert_outlives(r, name, b"tok-1")
    assert not redis_py.Lock(r2, name, timeout=5).acquire(blocking=False)
    assert renewing(name.encode()) == ["tok-1"]
    # redis-py's way to release by token from another object (another pool, too).
    other = redis_py.Lock(r2, name)
    other.local.token = b"tok-1"
    other.release()
    assert_ended_quietly(r, lost_log, name)
    with pytest.raises(LockNotOwnedError):
        redis_py.Lock(r, name).do_release(b"tok-1")


def test_redis_py_hold_outlives_the_thread_that_took_it(
    r: redis.Redis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    lk = redis_py.Lock(r, name)  # thread_local: the token and hold are the thread's
    tokens: list[bytes] = []

    def take() -> None:
        assert lk.acquire()
        tokens.append(lk.local.token)

    worker = threading.Thread(target=take)
    worker.start()
    worker.join(10)
    del worker
    assert len(tokens) == 1
    assert lk.local.token is None
    assert_outlives(r, name, tokens[0])
    lk.do_release(tokens[0])  # redis-py's hook, by token
    assert_ended_quietly(r, lost_log, name)


def test_redis_py_asyncio_hold_outlives_its_task(
    redis_url: str, r: redis.Redis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        lk = redis_py_aio.Lock(ar, name)

        async def take() -> bytes:
            assert await lk.acquire(token="atok")
            token: bytes = lk.local.token
            return token

        assert await asyncio.create_task(take()) == b"atok"
        # The task that held is gone: its hold goes to the next task using the object (as with
        # redis-py's one token per thread), and stays renewed.
        assert lk.local.token == b"atok"
        gc.collect()
        await asyncio.sleep(OUTLIVE)
        assert r.get(name) == b"atok"
        other = redis_py_aio.Lock(ar, name)
        other.local.token = b"atok"
        await other.release()
        assert r.get(name) is None
        assert renewing(name.encode()) == []
        await ar.aclose()

    asyncio.run(main())
    time.sleep(LEASE)
    assert "was lost" not in lost_log.text


def test_a_finite_timeout_still_ends_with_its_lease(r: redis.Redis, name: str) -> None:
    redis_py.Lock(r, name, timeout=0.5).acquire(token="short")
    prl.Lock(r, name, expire=1).acquire()
    assert renewing(name.encode()) == [] and renewing(f"lock:{name}".encode()) == []
    gc.collect()
    wait_until(lambda: r.get(name) is None and r.get(f"lock:{name}") is None, 3, "the leases")


# -- python-redis-lock ----------------------------------------------------------------------


def test_redis_lock_hold_outlives_its_lock_object(
    r: redis.StrictRedis, r2: redis.StrictRedis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    lk = prl.Lock(r, name)
    assert lk.acquire()
    held_id = lk.id
    del lk
    assert_outlives(r, f"lock:{name}", held_id.encode())
    assert not prl.Lock(r2, name, expire=5).acquire(blocking=False)
    # Still without expiry, as for the original, whichever object asks.
    with pytest.raises(prl.NotExpirable):
        prl.Lock(r, name, id=held_id).extend(5)
    # python-redis-lock's docs: release from another Lock with the same id.
    prl.Lock(r2, name, id=held_id).release()
    assert_ended_quietly(r, lost_log, f"lock:{name}")


def test_redis_lock_reset_and_reset_all_end_the_renewal(
    r: redis.StrictRedis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    assert prl.Lock(r, name + "a").acquire()
    assert prl.Lock(r, name + "b").acquire()
    gc.collect()
    assert renewing(f"lock:{name}a".encode()) != []
    prl.Lock(r, name + "a").reset()
    assert r.get(f"lock:{name}a") is None
    assert renewing(f"lock:{name}a".encode()) == []
    assert renewing(f"lock:{name}b".encode()) != []
    prl.reset_all(r)
    assert_ended_quietly(r, lost_log, f"lock:{name}a", f"lock:{name}b")


# -- the registry: no unbounded growth, nothing inherited by a forked child -----------------


def test_a_lost_hold_drops_out_and_released_ones_leave_nothing(
    r: redis.Redis, name: str, lost_log: pytest.LogCaptureFixture
) -> None:
    before = len(_common.renewing())
    redis_py.lock(r, name).acquire(token="gone")
    gc.collect()
    r.delete(name)  # an operator deletes the key: renewal finds the hold lost
    wait_until(lambda: renewing(name.encode()) == [], 3, "the lost hold to drop out")
    wait_until(lambda: "was lost" in lost_log.text, 3, "the loss to be logged")
    for i in range(20):
        redis_py.lock(r, f"{name}-{i}").acquire(token=f"t{i}")
        assert prl.Lock(r, f"{name}-{i}").acquire()
    gc.collect()
    assert len(_common.renewing()) == before + 40
    for i in range(20):
        redis_py.lock(r, f"{name}-{i}").do_release(f"t{i}")
    prl.reset_all(r)
    assert len(_common.renewing()) == before


def test_a_forked_child_neither_renews_nor_stops_the_parents_holds(
    r: redis.Redis, name: str
) -> None:
    redis_py.lock(r, name).acquire(token="parent")
    gc.collect()
    # The child reports what it renews, then exits at once.
    assert in_a_forked_child(lambda: repr(renewing(name.encode()))) == "[]"
    assert_outlives(r, name, b"parent")  # the parent still renews
    redis_py.lock(r, name).do_release(b"parent")
    assert renewing(name.encode()) == []
