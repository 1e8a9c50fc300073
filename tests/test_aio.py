"""redmutex.aio against a real redis-server: the Lock, Semaphore and RWLock contracts again,
through coroutines, plus what only asyncio has: the loop never blocks, cancellation is safe."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import multiprocessing
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def keys_left(r: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(k for k in r.keys(prefix + "*") if not k.endswith(b":fence"))


@pytest.mark.timeout(60)
def test_acquire_release_and_state(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    async def main() -> None:
        lock = aio.Lock(client, "a", ttl=5)
        assert await lock.acquire() is True
        assert lock.token is not None and len(lock.token) == 32
        assert isinstance(lock.fence, int)
        assert await lock.owned() is True
        assert await lock.locked() is True
        remaining = lock.remaining()
        assert remaining is not None and 0 < remaining <= 5
        await lock.extend(20)
        assert r.pttl(f"{prefix}{{a}}:lock") > 10_000
        await lock.release()
        assert lock.token is None and lock.fence is None
        assert await lock.locked() is False
        with pytest.raises(redmutex.LockNotOwnedError):
            await lock.release()

    run(main())
    assert keys_left(r, prefix) == []


@pytest.mark.timeout(60)
def test_two_tasks_with_two_objects_exclude_each_other(client: redmutex.Client) -> None:
    inside = 0
    overlaps = 0

    async def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(20):
            async with aio.Lock(client, "mutex", ttl=5):
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0.001)
                inside -= 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(5)))

    run(main())
    assert overlaps == 0


@pytest.mark.timeout(60)
def test_ownership_is_per_object_across_tasks(client: redmutex.Client) -> None:
    async def main() -> None:
        lock = aio.Lock(client, "shared", ttl=5)
        await asyncio.create_task(lock.acquire())
        # Another task releases what the object holds: ownership is the object's, not the task's.
        await asyncio.create_task(lock.release())
        assert await lock.locked() is False

    run(main())


@pytest.mark.timeout(60)
def test_with_timeout_and_lost_lease(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    async def main() -> None:
        holder = aio.Lock(client, "t", ttl=5)
        await holder.acquire()
        with pytest.raises(redmutex.LockTimeoutError):
            async with aio.Lock(client, "t", timeout=0.2):
                pass
        await holder.release()
        with pytest.raises(redmutex.LockLostError, match="lock was lost"):
            async with aio.Lock(client, "gone", ttl=5):
                r.delete(f"{prefix}{{gone}}:lock")

    run(main())


@pytest.mark.timeout(60)
def test_aexit_releases_once_when_the_body_raises_or_is_cancelled(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def main() -> None:
        with pytest.raises(ZeroDivisionError):
            async with aio.Lock(client, "raise", ttl=5):
                1 / 0  # noqa: B018
        assert r.exists(f"{prefix}{{raise}}:lock") == 0

        started = asyncio.Event()

        async def body() -> None:
            async with aio.Lock(client, "cancel", ttl=5):
                started.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r.exists(f"{prefix}{{cancel}}:lock") == 0

    run(main())


@pytest.mark.timeout(60)
def test_the_loop_keeps_ticking_while_50_tasks_wait(client: redmutex.Client) -> None:
    async def main() -> tuple[int, float, int]:
        holder = aio.Lock(client, "busy", ttl=10)
        await holder.acquire()
        ticks = 0
        worst_gap = 0.0

        async def ticker() -> None:
            nonlocal ticks, worst_gap
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst_gap = max(worst_gap, now - last)
                last = now
                ticks += 1

        async def waiter() -> bool:
            return await aio.Lock(client, "busy").acquire(timeout=1.0)

        tick_task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(waiter() for _ in range(50)))
        tick_task.cancel()
        await holder.release()
        return ticks, worst_gap, sum(results)

    ticks, worst_gap, acquired = run(main())
    assert acquired == 0
    # 1 s of waiting at 10 ms a tick: far more than half the ticks, and no long stall.
    assert ticks >= 50, ticks
    assert worst_gap < 0.25, worst_gap


@pytest.mark.timeout(120)
def test_cancelling_acquire_at_random_points_leaves_nothing(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    rng = random.Random(7)

    async def main() -> None:
        holder = aio.Lock(client, "c", ttl=30, fair=False)
        fair_holder = aio.Lock(client, "cf", ttl=30, fair=True)
        for i in range(1000):
            name, held = ("c", holder) if i % 2 else ("cf", fair_holder)
            held_now = rng.random() < 0.5
            if held_now:
                await held.acquire()
            lock = aio.Lock(client, name, ttl=30, fair=(name == "cf"))
            task = asyncio.create_task(lock.acquire(timeout=5))
            await asyncio.sleep(rng.random() * 0.002)
            task.cancel()
            try:
                got = await task
            except asyncio.CancelledError:
                got = False
            if got:
                await lock.release()
            if held_now:
                await held.release()
        # Cleanup of cancelled attempts runs in the background: give it a moment.
        for _ in range(50):
            if not keys_left(r, prefix):
                break
            await asyncio.sleep(0.1)

    run(main())
    assert keys_left(r, prefix) == []

    async def still_works() -> bool:
        return await aio.Lock(client, "c").acquire(timeout=2)

    assert run(still_works()) is True


def _process_holder(url: str, prefix: str, hold: float, ready: Any) -> None:
    async def main() -> None:
        client = redmutex.Client(url, prefix=prefix)
        async with aio.Lock(client, "xproc", ttl=10):
            ready.set()
            await asyncio.sleep(hold)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_handoff_between_processes(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_process_holder, args=(redis_url, prefix, 0.5, ready))
    proc.start()
    try:
        assert ready.wait(30)

        async def main() -> float:
            started = time.monotonic()
            async with aio.Lock(client, "xproc", timeout=10):
                return time.monotonic() - started

        waited = run(main())
        assert 0.2 < waited < 5, waited
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@pytest.mark.timeout(60)
def test_semaphore_limits_tasks(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    async def main() -> int:
        active = peak = 0

        async def worker() -> None:
            nonlocal active, peak
            async with aio.Semaphore(client, "sem", 3, ttl=5):
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.02)
                active -= 1

        await asyncio.gather(*(worker() for _ in range(20)))
        assert await aio.Semaphore(client, "sem", 3).holders() == 0
        return peak

    assert run(main()) == 3
    assert keys_left(r, prefix) == []


@pytest.mark.timeout(60)
def test_rwlock_readers_overlap_writer_excludes_and_upgrade_raises(
    client: redmutex.Client,
) -> None:
    async def main() -> None:
        rw = aio.RWLock(client, "rw", ttl=5)
        async with rw.read(), rw.read():
            assert await rw.readers() == 2
            with pytest.raises(redmutex.LockError, match="upgrade"):
                await rw.write().acquire(timeout=0.5)
        writer = rw.write()
        async with writer:
            assert await rw.locked() is True
            other_task_read = asyncio.create_task(
                aio.RWLock(client, "rw").read().acquire(timeout=0.3)
            )
            assert await other_task_read is False
        assert await rw.locked() is False

    run(main())


@pytest.mark.timeout(60)
def test_rwlock_guard_holds_across_objects_of_the_client(client: redmutex.Client) -> None:
    """A coroutine that makes its own aio.RWLock(client, name) per call nests like one object."""

    async def main() -> None:
        async with aio.RWLock(client, "rw", ttl=5).read():
            t0 = time.monotonic()
            with pytest.raises(redmutex.LockError, match="upgrade"):
                await aio.RWLock(client, "rw", ttl=5).write().acquire(timeout=3)
            assert time.monotonic() - t0 < 2
        async with aio.RWLock(client, "rw", ttl=5).write():
            t0 = time.monotonic()
            with pytest.raises(redmutex.LockError, match="holds the write lock"):
                await aio.RWLock(client, "rw", ttl=5).read().acquire(timeout=3)
            assert time.monotonic() - t0 < 2
        assert await aio.RWLock(client, "rw").locked() is False

    run(main())


@pytest.mark.timeout(60)
def test_locked_decorator_fills_the_name(client: redmutex.Client, r: redis.Redis) -> None:
    seen: list[bool] = []

    @aio.locked(client, "game:{game_id}", ttl=5, timeout=5)
    async def play(game_id: int, move: str) -> str:
        seen.append(await aio.Lock(client, f"game:{game_id}").locked())
        return move

    assert run(play(7, "e4")) == "e4"
    assert seen == [True]


@pytest.mark.timeout(60)
def test_locked_async_generator_holds_the_lock_across_the_iteration(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    # As `redmutex.locked` does for a generator: from the first __anext__() until the body
    # finishes, raises or is closed; asend() and athrow() reach the body.
    def held() -> bool:
        return r.exists(key_of("agen:7", "lock")) == 1

    @aio.locked(client, "agen:{n}", ttl=5, timeout=5)
    async def steps(n: int) -> AsyncIterator[int]:
        for i in range(3):
            await asyncio.sleep(0)
            yield n + i

    @aio.locked(client, "agen:{n}", ttl=5, timeout=5)
    async def failing(n: int) -> AsyncIterator[int]:
        yield n
        raise LookupError("inside")

    @aio.locked(client, "agen:{n}", ttl=5, timeout=5)
    async def echo(n: int) -> AsyncGenerator[str, int]:
        got = yield str(n)
        try:
            got = yield f"got {got}"
        except KeyError as exc:
            yield f"caught {exc.args[0]}"

    async def main() -> None:
        assert inspect.isasyncgenfunction(steps)
        it = steps(7)
        assert not held()  # nothing runs, and nothing is taken, before the first __anext__()
        assert [(v, held()) async for v in it] == [(7, True), (8, True), (9, True)]
        assert not held()

        early = steps(7)
        assert await early.__anext__() == 7 and held()
        await early.aclose()
        assert not held()

        with pytest.raises(LookupError):
            async for _ in failing(7):
                assert held()
        assert not held()

        talk = echo(7)
        assert await talk.__anext__() == "7"
        assert await talk.asend(5) == "got 5"
        assert await talk.athrow(KeyError("k")) == "caught k"
        assert held()
        with pytest.raises(StopAsyncIteration):
            await talk.__anext__()
        assert not held()

        # Two iterations of one name exclude each other for their whole length.
        order: list[str] = []

        async def consume(tag: str) -> None:
            async for _ in steps(7):
                order.append(tag)

        await asyncio.gather(consume("a"), consume("b"))
        assert order in (["a"] * 3 + ["b"] * 3, ["b"] * 3 + ["a"] * 3)

    run(main())


@pytest.mark.timeout(60)
def test_locked_refuses_asynccontextmanager_functions(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """Before: accepted (its __wrapped__ is an async generator function), so calling it gave an
    async generator, and `async with` on that raised an unrelated TypeError."""
    decorate = aio.locked(client, "acm", ttl=5, timeout=5)

    async def body() -> AsyncIterator[bool]:
        yield r.exists(f"{prefix}{{acm}}:lock") == 1

    with pytest.raises(TypeError, match=r"@contextlib\.asynccontextmanager function.*Put "):
        decorate(contextlib.asynccontextmanager(body))

    async def main() -> None:
        # The order the message points to: the lock held from entering to leaving.
        async with contextlib.asynccontextmanager(decorate(body))() as inside:
            assert inside is True

    run(main())
    assert r.exists(f"{prefix}{{acm}}:lock") == 0


@pytest.mark.timeout(60)
def test_locked_refuses_plain_functions(client: redmutex.Client) -> None:
    decorate = aio.locked(client, "job:{x}", ttl=5, timeout=5)

    def plain(x: int) -> int:
        return x

    def generator(x: int) -> Iterator[int]:
        yield x

    refused: list[Any] = [plain, generator, functools.partial(plain), lambda x: x]
    for func in refused:
        with pytest.raises(TypeError, match=r"use @redmutex\.locked"):
            decorate(func)

    # Accepted: async callables in their usual disguises.
    async def job(x: int) -> int:
        return x

    class AsyncCallable:
        async def __call__(self, x: int) -> int:
            return x

    @functools.wraps(job)
    def logged(x: int) -> Any:  # a plain decorator's wrapper around an async def
        return job(x)

    async def main() -> list[int]:
        accepted: list[Any] = [job, functools.partial(job), AsyncCallable(), logged]
        return [await decorate(func)(x) for x, func in enumerate(accepted)]

    assert run(main()) == [0, 1, 2, 3]


@pytest.mark.timeout(60)
def test_auto_renew_survives_a_blocked_loop(client: redmutex.Client) -> None:
    lost_calls: list[Any] = []

    async def main() -> tuple[bool, bool]:
        lock = aio.Lock(client, "renew", ttl=1.5, auto_renew=True, on_lost=lost_calls.append)
        await lock.acquire()
        # Three leases and more: block the loop on purpose, renewal runs in Rust.
        time.sleep(4.6)  # noqa: ASYNC251
        owned = await lock.owned()
        lost = lock.lost
        await lock.release()
        return owned, lost

    owned, lost = run(main())
    assert owned is True and lost is False
    assert lost_calls == []


def test_a_second_task_acquiring_the_same_object_is_told_so(client: redmutex.Client) -> None:
    """The refusal said "in another thread" for a task of the same thread."""

    async def main() -> None:
        holder = aio.Lock(client, "two-tasks-one-object", ttl=10)
        assert await holder.acquire()
        shared = aio.Lock(client, "two-tasks-one-object", ttl=10)
        first = asyncio.create_task(shared.acquire(timeout=10))
        await asyncio.sleep(0.1)
        with pytest.raises(
            redmutex.LockError, match=r"already acquiring \(in another thread or task\)"
        ):
            await shared.acquire(timeout=10)
        await holder.release()
        assert await first
        await shared.release()

    asyncio.run(main())
