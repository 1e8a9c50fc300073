"""The aio RWLock's deadlock guard and `asyncio.wait_for`: before Python 3.12 `wait_for` runs its
awaitable in a task of its own, so a read lock taken through `wait_for` was filed under that
child task, which ends as soon as the acquire returns. The caller's next write acquire (a
read->write upgrade by the same caller) then waited for its own read lock, for ever without a
timeout, where the same upgrade without `wait_for` raises LockError (and a write acquire
through `wait_for` was not seen as the caller's either). Now the task `wait_for` makes counts as
the task that awaits it (on Python 3.12 and later there is no such task)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redmutex
from redmutex import aio

T = TypeVar("T")

#: Long enough for any acquire that does not wait, far shorter than the test's own timeout.
BOUND = 3.0


async def bounded(awaitable: Awaitable[T]) -> T:
    """`awaitable`, cancelled after BOUND seconds (a hang fails the test instead of hanging the
    suite), in the calling task where `asyncio.timeout` exists."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(BOUND):
            return await awaitable
    return await asyncio.wait_for(awaitable, BOUND)


async def read_acquire(side: aio.RWLockSide) -> None:
    assert await side.acquire()


async def read_through_wait_for(side: aio.RWLockSide) -> None:
    assert await asyncio.wait_for(side.acquire(), 10)


async def enter_through_wait_for(side: aio.RWLockSide) -> None:
    await asyncio.wait_for(side.__aenter__(), 10)


async def read_through_nested_wait_for(side: aio.RWLockSide) -> None:
    assert await asyncio.wait_for(asyncio.wait_for(side.acquire(), 10), 20)


#: How the caller takes its read lock.
READS: dict[str, Callable[[aio.RWLockSide], Awaitable[None]]] = {
    "acquire": read_acquire,
    "wait_for-acquire": read_through_wait_for,
    "wait_for-aenter": enter_through_wait_for,
    "nested-wait_for": read_through_nested_wait_for,
}


async def write_acquire(side: aio.RWLockSide) -> Any:
    return await side.acquire()  # no timeout: waits for ever unless refused


async def write_enter(side: aio.RWLockSide) -> Any:
    async with side:
        pass


async def write_through_wait_for(side: aio.RWLockSide) -> Any:
    return await asyncio.wait_for(side.acquire(), 10)


#: How the caller then asks for the write lock.
WRITES: dict[str, Callable[[aio.RWLockSide], Awaitable[Any]]] = {
    "acquire": write_acquire,
    "aenter": write_enter,
    "wait_for-acquire": write_through_wait_for,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("read", list(READS))
def test_an_upgrade_after_a_read_through_wait_for_raises(
    client: redmutex.Client, read: str, write: str
) -> None:
    async def main() -> None:
        rw = aio.RWLock(client, "rw", ttl=5)
        reader = rw.read()
        await bounded(READS[read](reader))
        with pytest.raises(redmutex.LockError, match="upgrade"):
            await bounded(WRITES[write](rw.write()))
        await reader.release()
        writer = rw.write()
        assert await bounded(writer.acquire())  # fine once the read lock is given back
        await writer.release()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_read_after_a_write_through_wait_for_raises(client: redmutex.Client) -> None:
    """The other half of the guard: any lock while the caller holds the write lock."""

    async def main() -> None:
        rw = aio.RWLock(client, "rw", ttl=5)
        writer = rw.write()
        assert await asyncio.wait_for(writer.acquire(), 10)
        with pytest.raises(redmutex.LockError, match="holds the write lock"):
            await bounded(rw.read().acquire())
        await writer.release()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_read_held_by_another_task_still_makes_a_writer_wait(client: redmutex.Client) -> None:
    """Only the awaiting caller inherits the read lock of the task `wait_for` ran: a read lock of
    a task that runs beside the caller (which then may release it) makes the writer wait, as
    before."""

    async def main() -> None:
        rw = aio.RWLock(client, "rw", ttl=5)
        reader = rw.read()
        taken = asyncio.Event()
        release = asyncio.Event()

        async def read_beside() -> None:
            assert await asyncio.wait_for(reader.acquire(), 10)
            taken.set()
            await release.wait()
            await reader.release()

        beside = asyncio.create_task(read_beside())
        await bounded(taken.wait())
        assert await bounded(rw.write().acquire(timeout=0.3)) is False  # waited, not refused
        release.set()
        await bounded(beside)
        writer = rw.write()
        assert await bounded(writer.acquire())
        await writer.release()

    asyncio.run(main())
