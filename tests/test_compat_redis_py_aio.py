"""redmutex.compat.redis_py.asyncio: redis-py's asyncio Lock on redmutex's engine."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
import redmutex
from redis.exceptions import LockError, LockNotOwnedError
from redmutex._server import RedisServer
from redmutex.compat.redis_py import _base
from redmutex.compat.redis_py.asyncio import Lock, lock

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def name() -> str:
    return f"rpa-{uuid.uuid4().hex[:10]}"


def test_every_call(redis_url: str, r: redis.Redis, name: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        lk = lock(ar, name, timeout=2)
        assert isinstance(lk, Lock)
        with pytest.raises(LockError, match="not owned or is already unlocked"):
            await lk.release()
        with pytest.raises(LockError, match="Cannot extend an unlocked lock"):
            lk.extend(1)
        assert await lk.acquire(blocking=False)
        assert r.get(name) == lk.local.token
        assert await lk.locked() and await lk.owned()
        assert await lk.extend(10) is True
        assert 11000 < r.pttl(name) <= 12000
        assert await lk.extend(3, replace_ttl=True) is True
        assert 2000 < r.pttl(name) <= 3000
        assert await lk.reacquire() is True
        assert 1000 < r.pttl(name) <= 2000
        assert not await Lock(ar, name).acquire(blocking=False)
        assert not await Lock(ar, name, blocking_timeout=0.2).acquire()
        await lk.release()
        assert not await lk.locked()
        async with Lock(ar, name, timeout=5) as held:
            assert await held.owned()
        with pytest.raises(LockNotOwnedError):
            async with Lock(ar, name, timeout=5):
                r.delete(name)
        assert await lk.do_acquire(b"tok")
        lk.local.token = b"tok"
        await lk.do_release(b"tok")
        await ar.aclose()

    run(main())


def test_token_belongs_to_the_task_not_the_thread(redis_url: str, name: str) -> None:
    """redis-py's asyncio Lock keeps one token per thread, so another task of the loop could
    release the first task's lock. Here the token is the task's."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        shared = Lock(ar, name, timeout=5)
        assert await shared.acquire()

        async def other() -> None:
            assert shared.local.token is None
            with pytest.raises(LockError, match="not owned"):
                await shared.release()
            assert not await shared.owned()

        await asyncio.create_task(other())
        assert await shared.owned()
        await shared.release()
        await ar.aclose()

    run(main())


@pytest.mark.parametrize("timeout", [5, None])
@pytest.mark.parametrize("how", ["wait_for", "gather", "shield", "create_task"])
def test_a_hold_taken_in_a_child_task_goes_to_the_task_that_awaited_it(
    redis_url: str, r: redis.Redis, name: str, how: str, timeout: int | None
) -> None:
    """Before Python 3.12 `asyncio.wait_for` (and always `gather`, `shield`, a task awaited) runs
    the acquire in a task of its own, which has ended when its caller goes on: the caller owns
    the lock, as with redis-py, and releases it. Before, the token stayed with the ended task:
    the caller's release raised LockError "not owned" and the key was left held (for good
    without a timeout, renewed by this process)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        lk = Lock(ar, name, timeout=timeout)
        acquiring = lk.acquire()
        if how == "wait_for":
            assert await asyncio.wait_for(acquiring, 10)
        elif how == "gather":
            assert await asyncio.gather(acquiring) == [True]
        elif how == "shield":
            assert await asyncio.shield(acquiring)
        else:
            assert await asyncio.create_task(acquiring)
        assert lk.local.token is not None
        assert await lk.owned()
        await lk.release()
        assert r.exists(name) == 0
        assert lk.local.token is None
        await ar.aclose()

    run(main())


def test_a_running_task_keeps_its_token_from_a_task_that_ended_holding(
    redis_url: str, r: redis.Redis, name: str
) -> None:
    """Only an ended task's hold is taken over, by the next task that uses the object; a task
    that still runs keeps its own."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        shared = Lock(ar, name, timeout=5)
        other = Lock(ar, f"{name}-2", timeout=5)
        assert await asyncio.create_task(shared.acquire())  # ended, holding
        assert await other.acquire()  # this task holds one of its own

        async def sibling() -> None:
            assert other.local.token is None
            assert shared.local.token is not None  # taken over from the ended task
            await shared.release()

        await asyncio.create_task(sibling())
        assert shared.local.token is None
        assert r.exists(name) == 0
        assert await other.owned()
        await other.release()
        await ar.aclose()

    run(main())


def test_waiters_are_woken_and_mixed_with_redis_py(redis_url: str, name: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        ar2 = redis.asyncio.Redis.from_url(redis_url)
        holder = Lock(ar, name, timeout=10)
        assert await holder.acquire()

        async def wait() -> float:
            assert await Lock(ar2, name, timeout=10, sleep=5).acquire(blocking_timeout=20)
            return time.monotonic()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await holder.release()
        assert await task - released < 1.0  # woken, not after sleep=5
        # An original redis-py asyncio Lock and the shim exclude each other.
        original = redis.asyncio.lock.Lock(ar2, name, timeout=5)
        assert not await original.acquire(blocking=False)
        r = redis.Redis.from_url(redis_url)
        r.delete(name)
        r.close()
        assert await original.acquire(blocking=False)
        assert not await Lock(ar, name, timeout=5).acquire(blocking=False)

        async def shim_wait() -> float:
            assert await Lock(ar, name, timeout=5, sleep=0.1).acquire(blocking_timeout=20)
            return time.monotonic()

        task = asyncio.create_task(shim_wait())
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await original.release()
        assert await task - released < 0.6  # within sleep of the original's release
        await ar.aclose()
        await ar2.aclose()

    run(main())


def test_a_cancelled_waiter_takes_nothing(redis_url: str, r: redis.Redis, name: str) -> None:
    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        holder = Lock(ar, name, timeout=10)
        assert await holder.acquire()
        waiter = asyncio.create_task(Lock(ar, name, timeout=10).acquire())
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder.release()
        await asyncio.sleep(0.3)
        assert r.get(name) is None  # the cancelled waiter did not take it after all
        await ar.aclose()

    run(main())


@pytest.mark.timeout(120)
def test_a_waiter_cancelled_around_the_release_never_keeps_the_lock(
    redis_url: str, r: redis.Redis, name: str
) -> None:
    """The cancel lands just before, at or just after the grant: an acquire that raised
    CancelledError holds nothing (API.md: a cancelled acquire() neither keeps nor later takes
    the lock). Before, a hold that settled as its awaitable was cancelled was dropped with the
    lock still set: 27 of 57 cancelled waiters kept it for their whole lease (the helper's
    script); redis-py's own Lock: none of 100."""

    async def main() -> tuple[list[int], int]:
        ar = redis.asyncio.Redis.from_url(redis_url)
        kept, cancelled = [], 0
        for run_no in range(60):
            holder = Lock(ar, name, timeout=30, sleep=0.01)
            assert await holder.acquire(blocking=False), "held by an earlier cancelled waiter"
            waiter = Lock(ar, name, timeout=30, sleep=0.01, thread_local=False)
            task = asyncio.ensure_future(waiter.acquire())
            await asyncio.sleep(0.005)
            await holder.release()
            for _ in range(run_no % 9):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
                await waiter.release()
                continue
            except asyncio.CancelledError:
                cancelled += 1
            await asyncio.sleep(0.05)  # a give-back runs in the background
            if r.get(name) is not None:
                kept.append(run_no)
                r.delete(name)
        await ar.aclose()
        return kept, cancelled

    kept, cancelled = run(main())
    assert kept == []
    assert cancelled >= 5  # the cancels did land (a waiter that got the lock first is fine)


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_calls_awaited_in_another_task_act_for_the_caller(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """`gather`, `create_task` and (before Python 3.12) `wait_for` await in a task of their own.
    The shim's token is per task, and owned()/release()/extend()/reacquire() read it in that
    task, which has none: the extend raised AttributeError and the release LockError, leaving the
    lock held (an audit, against redis-py on the same server). They read it as they are called
    now, as redis-py's release() does."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            held = lock_class(ar, name, timeout=5)
            assert await held.acquire()
            both = await asyncio.gather(held.owned(), held.extend(5), held.reacquire())
            assert both == [True, True, True]
            assert await asyncio.create_task(held.extend(1, replace_ttl=True)) is True
            assert 0 < r.pttl(name) <= 1000
            assert await asyncio.wait_for(held.owned(), 5) is True
            await asyncio.wait_for(held.release(), 5)
            assert r.get(name) is None
        finally:
            await ar.aclose()

    run(main())


# -- release() as redis-py's `async def`: the token is cleared once the release has run --------


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_release_raises_when_awaited_and_keeps_the_token_until_it_ran(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """redis-py 8.1's asyncio release() is `async def` and clears the token only after the
    release ran in Redis. The shim cleared it (and stopped renewal) as release() was called and
    raised LockError right there: a release task cancelled before it ran left the lock held by
    nobody (owned() False, the retry raised LockError), and `gather(other.release(),
    lk.release(), return_exceptions=True)` raised instead of releasing `lk` (an audit)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = lock_class(ar, name, timeout=30)
            unheld = lk.release()  # raises only when awaited
            with pytest.raises(LockError, match="not owned or is already unlocked"):
                await unheld
            assert await lk.acquire()
            task = asyncio.ensure_future(lk.release())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert lk.local.token is not None
            assert await lk.owned()
            await lk.release()  # the retry releases
            assert r.exists(name) == 0
            assert lk.local.token is None
            assert await lk.acquire()
            other = lock_class(ar, f"{name}-other", timeout=30)
            outcome = await asyncio.gather(other.release(), lk.release(), return_exceptions=True)
            assert isinstance(outcome[0], LockError)
            assert outcome[1] is None
            assert r.exists(name) == 0
            assert lk.local.token is None
        finally:
            await ar.aclose()

    run(main())


def test_a_release_cancelled_before_it_ran_leaves_the_renewal_on(
    redis_url: str, r: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No timeout: the hold is a renewed lease; a release that never ran stops nothing."""
    monkeypatch.setattr(_base, "NO_EXPIRY_LEASE", 0.6)

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = Lock(ar, name)
            assert await lk.acquire()
            task = asyncio.ensure_future(lk.release())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(2.0)  # over three leases
            assert r.get(name) == lk.local.token
            assert await lk.owned()
            await lk.release()
            assert r.exists(name) == 0
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("lock_class", "timeout"),
    [(Lock, 60), (Lock, None), (redis.asyncio.lock.Lock, 60)],
    ids=["shim", "shim-no-timeout", "redis-py"],
)
def test_a_release_that_failed_keeps_the_hold_for_a_retry(
    make_server: Callable[..., RedisServer], lock_class: Any, timeout: int | None
) -> None:
    """Redis stopped (its data kept on disk): the release raises ConnectionError and the object
    still holds; once Redis is back, a retry releases. Before, the shim had cleared the token:
    the retry raised LockError and the key stayed (for good in redis-py's terms)."""
    server = make_server(["--appendonly", "yes", "--appendfsync", "always"])

    async def main() -> None:
        ar = redis.asyncio.Redis(port=server.port)
        try:
            lk = lock_class(ar, "failed-release", timeout=timeout)
            assert await lk.acquire()
            server.stop()
            with pytest.raises((redis.exceptions.ConnectionError, redmutex.ConnectionError)):
                await lk.release()
            assert lk.local.token is not None
            server.start()
            await lk.release()
            assert lk.local.token is None
            assert await ar.exists("failed-release") == 0
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
@pytest.mark.parametrize("timeout", [0, None])
def test_do_extend_of_a_lock_without_expiry_is_refused_as_in_redis_py(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any, timeout: int | None
) -> None:
    """A falsy timeout is no expiry in redis-py: its extend script finds no TTL and answers
    LockNotOwnedError (extend() with timeout=0, do_extend() with either). The shim extended the
    renewed lease it keeps instead (an audit)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = lock_class(ar, name, timeout=timeout)
            assert await lk.acquire()
            if timeout == 0:
                with pytest.raises(LockNotOwnedError, match="extend a lock that's no longer"):
                    await lk.extend(5)
            with pytest.raises(LockNotOwnedError, match="extend a lock that's no longer"):
                await lk.do_extend(5, False)
            assert await lk.owned()
            await lk.release()
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.parametrize("timeout", [0, None])
def test_do_reacquire_of_a_lock_without_expiry_is_refused(
    redis_url: str, r: redis.Redis, name: str, timeout: int | None
) -> None:
    """redis-py's reacquire() with timeout=0 sends PEXPIRE 0, which deletes the lock, and
    answers True; the shim deleted its renewed lease the same way (renewal then logged it lost).
    It refuses as reacquire() refuses timeout=None."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = Lock(ar, name, timeout=timeout)
            assert await lk.acquire()
            if timeout == 0:
                with pytest.raises(LockError, match="reacquire a lock with no timeout"):
                    await lk.reacquire()
            with pytest.raises(LockError, match="reacquire a lock with no timeout"):
                await lk.do_reacquire()
            assert await lk.owned()
            await lk.release()
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_do_acquire_only_takes_the_key(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """redis-py's do_acquire() is the SET alone: acquire() sets local.token after it. The shim's
    set the token too (and replaced the object's hold)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = lock_class(ar, name, timeout=5)
            assert await lk.do_acquire(b"tok")
            assert r.get(name) == b"tok"
            assert lk.local.token is None
            assert not await lk.owned()
            with pytest.raises(LockError, match="not owned or is already unlocked"):
                await lk.release()
            lk.local.token = b"tok"
            await lk.release()
            assert r.exists(name) == 0
        finally:
            await ar.aclose()

    run(main())


# -- found by the differential audit against redis-py (each runs on redis-py's Lock as well) --


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_a_str_token_set_in_local_extends_reacquires_and_releases(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """A token kept as text and set in ``local.token`` works for every call, as in redis-py;
    the shim's extend and reacquire raised AttributeError when awaited."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            holder = lock_class(ar, name, timeout=5)
            assert await holder.acquire(token="job-42")
            lk = lock_class(ar, name, timeout=5)
            lk.local.token = "job-42"
            assert await lk.extend(5) is True
            assert 9000 < r.pttl(name) <= 10000
            assert await lk.reacquire() is True
            assert 4000 < r.pttl(name) <= 5000
            await lk.release()
            assert r.get(name) is None
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_the_exit_warning_is_on_redis_pys_logger(
    redis_url: str, name: str, lock_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``async with`` exit warning goes to redis-py's ``redis.asyncio.lock`` logger."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = lock_class(ar, name, timeout=5, raise_on_release_error=False)
            async with lk:
                await lk.release()
        finally:
            await ar.aclose()

    with caplog.at_level(logging.WARNING, logger="redis.asyncio.lock"):
        run(main())
    assert [(rec.name, rec.levelno) for rec in caplog.records] == [
        ("redis.asyncio.lock", logging.WARNING)
    ]


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_a_timeout_redis_refuses_is_redis_pys_response_error_at_acquire(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """A negative or sub-millisecond ``timeout`` is Redis' ResponseError at acquire, as in
    redis-py (the shim raised ValueError, or took a sub-millisecond lease)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            for timeout in (-1, 0.0004):
                lk = lock_class(ar, name, timeout=timeout)
                with pytest.raises(redis.exceptions.ResponseError, match="invalid expire time"):
                    await lk.acquire(blocking=False)
                assert r.exists(name) == 0 and lk.local.token is None
        finally:
            await ar.aclose()

    run(main())


@pytest.mark.parametrize("lock_class", [Lock, redis.asyncio.lock.Lock], ids=["shim", "redis-py"])
def test_sleep_is_only_read_when_the_acquire_must_wait(
    redis_url: str, r: redis.Redis, name: str, lock_class: Any
) -> None:
    """``sleep=None`` takes a free lock, as in redis-py (the shim raised TypeError at once)."""

    async def main() -> None:
        ar = redis.asyncio.Redis.from_url(redis_url)
        try:
            lk = lock_class(ar, name, timeout=5, sleep=None)
            assert await lk.acquire()
            other = lock_class(ar, name, timeout=5, sleep=None)
            assert await other.acquire(blocking=False) is False
            with pytest.raises(TypeError):
                await asyncio.wait_for(other.acquire(blocking_timeout=5), 2)
            await lk.release()
            assert r.exists(name) == 0
        finally:
            await ar.aclose()

    run(main())
