"""A re-entrant aio Lock and `asyncio.wait_for`: before Python 3.12 `wait_for` runs its awaitable
in a task of its own, and the lock's owner is the task. An acquire through `wait_for` was filed
under that child task, which ends when the acquire returns: its caller did not see the hold
(`token` None), its release raised LockNotOwnedError and the hold stayed in Redis until its lease
ran out; a re-entry through `wait_for` waited for the caller's own hold until the timeout. Now
the task `wait_for` makes counts as the task that awaits it, as the RWLock's deadlock guard
already counts it (on Python 3.12 and later there is no such task)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redmutex
from redmutex import aio

pytestmark = pytest.mark.timeout(60)


def lock_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:lock"


def test_an_acquire_through_wait_for_is_the_callers_hold(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def main() -> None:
        lock = aio.Lock(client, "wf-first", ttl=10, reentrant=True)
        assert await asyncio.wait_for(lock.acquire(), 5)
        assert lock.token is not None
        assert r.get(lock_key(prefix, "wf-first")) == lock.token.encode()
        assert await lock.owned()
        await lock.release()
        assert lock.token is None

    asyncio.run(main())
    assert not r.exists(lock_key(prefix, "wf-first"))


def test_a_reentry_through_wait_for_does_not_wait_for_itself(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def nested(lock: aio.Lock) -> str | None:
        async with lock:
            return lock.token

    async def main() -> None:
        lock = aio.Lock(client, "wf-nested", ttl=10, reentrant=True)
        async with lock:
            outer = lock.token
            assert await asyncio.wait_for(lock.acquire(), 2)
            await lock.release()
            # Through another object of the same client and name, and in a `with` block.
            other = aio.Lock(client, "wf-nested", ttl=10, reentrant=True)
            assert await asyncio.wait_for(nested(other), 2) == outer
            assert lock.token == outer
            assert r.get(lock_key(prefix, "wf-nested")) == outer.encode()
        assert lock.token is None

    asyncio.run(main())
    assert not r.exists(lock_key(prefix, "wf-nested"))


def test_another_task_still_waits(client: redmutex.Client) -> None:
    # Control: tasks the caller starts itself are other owners.
    async def main() -> None:
        lock = aio.Lock(client, "wf-other", ttl=10, reentrant=True)
        async with lock:
            other = asyncio.ensure_future(lock.acquire(timeout=0.2))
            assert await other is False
            both = asyncio.gather(asyncio.wait_for(lock.acquire(timeout=0.2), 5))
            assert await both == [False]

    asyncio.run(main())


def test_a_holding_task_awaited_through_wait_for_releases_its_own_hold(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    # Before 3.12 `wait_for(task, t)` gives the task the same mark as a task it made itself: the
    # worker's exit was filed under its awaiting caller, which held nothing (LockNotOwnedError),
    # and the worker's hold stayed in Redis until its lease ran out.
    async def worker(lock: aio.Lock) -> str | None:
        async with lock:
            await asyncio.sleep(0.2)
            return lock.token

    async def main() -> None:
        lock = aio.Lock(client, "wf-worker", ttl=10, reentrant=True)
        task = asyncio.create_task(worker(lock))
        await asyncio.sleep(0.05)  # the worker holds now
        assert await asyncio.wait_for(task, 5) is not None
        assert lock.token is None

    asyncio.run(main())
    assert not r.exists(lock_key(prefix, "wf-worker"))


def test_a_holding_task_under_wait_for_reenters_through_another_object(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    # The same, through another re-entrant aio.Lock of the client and name: its re-entry was
    # filed under the awaiting caller and waited for the task's own hold until the timeout.
    async def main() -> None:
        first = aio.Lock(client, "wf-cross", ttl=10, reentrant=True)
        second = aio.Lock(client, "wf-cross", ttl=10, reentrant=True)
        took = asyncio.Event()
        go = asyncio.Event()

        async def worker() -> str | None:
            await first.acquire()
            took.set()
            await go.wait()
            assert await second.acquire(timeout=2)
            token = second.token
            await second.release()
            await first.release()
            return token

        task = asyncio.create_task(worker())
        await took.wait()
        go.set()
        assert await asyncio.wait_for(task, 5) is not None

    asyncio.run(main())
    assert not r.exists(lock_key(prefix, "wf-cross"))
