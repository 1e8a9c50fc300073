"""A cancelled asyncio `acquire()` neither keeps nor later takes what it waited for.

The race (issue 13, item 2): a synchronous holder releases while an asyncio waiter is about to
be granted, and the waiter's task is cancelled at that moment. Whatever the cancelled attempt
obtained in Redis (a fair lock's grant handed over by the release, a lock, a permit, a read or
write lock taken by its own attempt) must be given back, and a fair lock's top-up must never run
for it. Each race is checked in Redis itself (redis-py) right after it.

The default run does a few hundred races per kind within a time cap. The soak runs at least
2,000 per kind: `REDMUTEX_AIO_CANCEL_RACES=2000 pytest tests/test_aio_cancel.py` (or
`make soak-aio-cancel`); `REDMUTEX_AIO_CANCEL_SECONDS` caps the time per kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio

RACES = int(os.environ.get("REDMUTEX_AIO_CANCEL_RACES", "200"))
SECONDS = float(os.environ.get("REDMUTEX_AIO_CANCEL_SECONDS", "15"))
# A leftover hold of a cancelled attempt outlives this by far (its lease is 30 s, a fair grant's
# several seconds); the give-back of a cancelled attempt takes milliseconds.
SETTLE = 1.5

KINDS = ["lock-fair", "lock-unfair", "semaphore", "rw-read", "rw-write"]


@dataclass
class Race:
    """One kind of race: how to make the holder and the cancelled waiter, and what is left."""

    holder: Callable[[int], Any]
    waiter: Callable[[], Any]
    left: Callable[[], dict[str, int]]
    free: Callable[[], bool]
    keys: list[bytes]


def make_race(
    kind: str,
    client: redmutex.Client,
    other: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
) -> Race:
    name = f"race-{kind}"

    def key(suffix: str) -> bytes:
        return key_of(name, suffix)

    if kind.startswith("lock"):
        fair = kind == "lock-fair"
        lock_key, queue = key("lock"), key("lock:queue")
        return Race(
            holder=lambda _i: redmutex.Lock(client, name, ttl=30, fair=fair),
            waiter=lambda: aio.Lock(client, name, ttl=30, fair=fair),
            left=lambda: {"lock": int(r.exists(lock_key)), "queued": int(r.hlen(queue))},
            free=lambda: redmutex.Lock(other, name, ttl=5, fair=fair).acquire(timeout=5),
            keys=[lock_key, queue],
        )
    if kind == "semaphore":
        holders, queue = key("sem:holders"), key("sem:queue")
        return Race(
            holder=lambda _i: redmutex.Semaphore(client, name, 1, ttl=30),
            waiter=lambda: aio.Semaphore(client, name, 1, ttl=30),
            left=lambda: {"permits": int(r.zcard(holders)), "queued": int(r.llen(queue))},
            free=lambda: redmutex.Semaphore(other, name, 1, ttl=5).acquire(timeout=5),
            keys=[holders, queue, key("sem:queue:deadlines")],
        )
    readers, writer, waiting = key("rw:readers"), key("rw:writer"), key("rw:writers_waiting")
    rw = redmutex.RWLock(client, name, ttl=30)

    def left() -> dict[str, int]:
        return {
            "readers": int(r.zcard(readers)),
            "writer": int(r.exists(writer)),
            "writers waiting": int(r.zcard(waiting)),
        }

    keys = [readers, writer, waiting]
    if kind == "rw-read":
        # A reader waits for the writer that holds it.
        return Race(
            holder=lambda _i: rw.write(),
            waiter=lambda: aio.RWLock(client, name, ttl=30).read(),
            left=left,
            free=lambda: redmutex.RWLock(other, name, ttl=5).write().acquire(timeout=5),
            keys=keys,
        )
    # A writer waits for a writer, or for a reader.
    return Race(
        holder=lambda i: rw.write() if i % 2 else rw.read(),
        waiter=lambda: aio.RWLock(client, name, ttl=30).write(),
        left=left,
        free=lambda: redmutex.RWLock(other, name, ttl=5).write().acquire(timeout=5),
        keys=keys,
    )


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def one_race(race: Race, i: int, rng: random.Random) -> tuple[bool, dict[str, int]]:
    """Holder holds; waiter waits; the holder releases and the waiter is cancelled at once.
    Returns whether the waiter's acquire completed before the cancellation (then it is ours to
    release) and what is left in Redis once the cancelled attempt has settled."""
    holder = race.holder(i)
    assert holder.acquire(timeout=5)
    waiter = race.waiter()
    # Every other race enters a block (`async with`) instead of calling acquire().
    entering = i % 2 == 1
    task = asyncio.ensure_future(waiter.__aenter__() if entering else waiter.acquire())
    await asyncio.sleep(rng.uniform(0.001, 0.006))
    holder.release()
    # Sweep the window in which the grant is on its way: right away, or a little later.
    pick = rng.random()
    if pick < 0.4:
        busy_wait(rng.uniform(0, 0.0002))
    elif pick < 0.6:
        busy_wait(rng.uniform(0, 0.001))
    elif pick < 0.7:
        await asyncio.sleep(0)
    task.cancel()
    completed = False
    try:
        completed = bool(await task)  # __aenter__ returns the (truthy) object
    except asyncio.CancelledError:
        pass
    if completed:
        await waiter.release()
    deadline = time.monotonic() + SETTLE
    left = race.left()
    while any(left.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        left = race.left()
    # `waiter` lives until here, so a fair lock's top-up would have run for a kept grant.
    del waiter
    return completed, left


@pytest.mark.timeout(SECONDS + 120)
@pytest.mark.parametrize("kind", KINDS)
def test_cancelled_acquire_keeps_nothing(
    kind: str,
    client: redmutex.Client,
    other_client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
) -> None:
    race = make_race(kind, client, other_client, r, key_of)
    rng = random.Random(f"{kind}-13")
    failures: list[tuple[int, dict[str, int]]] = []
    completed = runs = 0

    async def main() -> None:
        nonlocal completed, runs
        stop = time.monotonic() + SECONDS
        while runs < RACES and time.monotonic() < stop:
            done, left = await one_race(race, runs, rng)
            runs += 1
            completed += done
            if any(left.values()):
                failures.append((runs, left))
                r.delete(*race.keys)

    asyncio.run(main())
    print(f"{kind}: {len(failures)} of {runs} left a hold ({completed} acquired before the cancel)")
    assert runs >= min(RACES, 50), f"only {runs} races within {SECONDS} s"
    assert failures == [], f"{len(failures)} of {runs} races left something: {failures[:5]}"
    # And nothing blocks anybody afterwards.
    assert race.free()


@pytest.mark.timeout(60)
def test_acquire_done_but_task_cancelled_before_it_resumed(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    """The acquire finished with the lock, but the task was cancelled before it could see that
    (its awaitable already resolved): the coroutine raises CancelledError, so the lock is given
    back rather than kept by an object whose caller believes it failed."""
    lock_key = key_of("resolved", "lock")

    async def main() -> tuple[bool, bool]:
        lock = aio.Lock(client, "resolved", ttl=30, fair=True)
        task = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)  # the task now awaits the core's future
        deadline = time.monotonic() + 10
        while not r.exists(lock_key):
            assert time.monotonic() < deadline
            # Block the loop: the result waits for the loop's next turn.
            time.sleep(0.001)  # noqa: ASYNC251
        time.sleep(0.05)  # noqa: ASYNC251
        # Next turn: this coroutine runs first, then the bridge resolves the future and
        # schedules the task; one more turn and this coroutine runs just before the task.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        waited_on: Any = getattr(task, "_fut_waiter", None)
        resolved = waited_on is not None and waited_on.done() and not waited_on.cancelled()
        task.cancel()
        cancelled = False
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        assert lock.token is None
        return resolved, cancelled

    resolved, cancelled = asyncio.run(main())
    if not (resolved and cancelled):
        pytest.skip("this event loop did not order the callbacks as the test needs")
    deadline = time.monotonic() + SETTLE
    while r.exists(lock_key) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert r.exists(lock_key) == 0


STUCK_KINDS: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=10),
    "lock-fair": lambda c, n: aio.Lock(c, n, ttl=10, fair=True),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=10),
    "rw-write": lambda c, n: aio.RWLock(c, n, ttl=10).write(),
    "multilock": lambda c, n: aio.MultiLock(c, [n, n + "-b"], ttl=10),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(STUCK_KINDS))
def test_a_waiter_cancelled_as_its_busy_reply_lands_can_acquire_again(
    kind: str, client: redmutex.Client, other_client: redmutex.Client
) -> None:
    """The cancel lands in the loop iteration that read the first attempt's "busy" reply: the
    acquire was handed to the runtime to wait, and its task aborted before it ever ran. The
    object stayed "acquiring" for good (11-17 of 20 per kind before); and an acquire right after
    any cancelled wait raised "already acquiring" until the aborted task was dropped."""
    make = STUCK_KINDS[kind]

    async def trial(i: int) -> list[str]:
        errors: list[str] = []
        # An RWLock's holder through another client: this task, holding the write lock through
        # an RWLock of the client, would be refused the waiter's side (the deadlock guard).
        holding = other_client if kind.startswith("rw") else client
        holder, waiter = make(holding, f"stuck-{kind}-{i}"), make(client, f"stuck-{kind}-{i}")
        assert await holder.acquire()
        task = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0)  # its first attempt goes out on the loop's connection
        time.sleep(0.003)  # noqa: ASYNC251 - its "busy" reply arrives meanwhile
        asyncio.get_running_loop().call_later(0, task.cancel)  # runs after that reply is read
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:  # right away, while the lock is still held: not acquired, no error
            assert await waiter.acquire(blocking=False) is False
        except redmutex.LockError as err:
            errors.append(f"at once: {err}")
        await holder.release()
        try:
            assert await waiter.acquire(timeout=2)
            await waiter.release()
        except redmutex.LockError as err:
            errors.append(f"after the release: {err}")
        return errors

    async def main() -> list[str]:
        errors: list[str] = []
        for i in range(20):
            errors += await trial(i)
        return errors

    errors = asyncio.run(main())
    assert errors == [], f"{len(errors)} failures in 20 trials: {errors[:3]}"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
@pytest.mark.timeout(60)
def test_an_acquire_right_after_a_cancelled_wait_neither_fails_nor_waits_for_the_old(
    client: redmutex.Client,
) -> None:
    """`asyncio.timeout` ends a wait; the same task tries again at once. The object was still
    "acquiring" until the aborted wait was dropped on the runtime (a done-callback later in
    the loop's turn): the retry raised LockError (10 of 10 per delay before)."""

    async def main() -> list[str]:
        errors: list[str] = []
        for i, delay in enumerate([0.0, 0.001, 0.01, 0.05] * 3):
            holder, waiter = aio.Lock(client, f"again-{i}"), aio.Lock(client, f"again-{i}")
            assert await holder.acquire()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await waiter.acquire()
            try:
                assert await waiter.acquire(blocking=False) is False
            except redmutex.LockError as err:
                errors.append(f"{delay}: {err}")
            await holder.release()
            assert await waiter.acquire(timeout=2)
            await waiter.release()
        return errors

    errors = asyncio.run(main())
    assert errors == [], errors


# -- a release cut short: the object is released (the release goes on) and acts so -----------

CUT_KINDS: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=30),
    "lock-reentrant": lambda c, n: aio.Lock(c, n, ttl=30, reentrant=True),
    "lock-fair": lambda c, n: aio.Lock(c, n, ttl=30, fair=True),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=30),
    "rw-write": lambda c, n: aio.RWLock(c, n, ttl=30).write(),
}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["release", "aexit"])
@pytest.mark.parametrize("kind", list(CUT_KINDS))
def test_a_release_cut_short_leaves_the_object_released(
    client: redmutex.Client, other_client: redmutex.Client, kind: str, how: str
) -> None:
    """`asyncio.timeout` cancels a release whose command is out: the release goes on, so the
    object holds nothing from then on, and its next acquire takes a new hold (the release of
    the old one lands meanwhile) that a release then gives back. Before: "already holds"
    (LockError) from the next acquire, or, re-entrant, an acquire that re-entered the hold being
    released, whose release then raised LockNotOwnedError."""

    async def main() -> list[str]:
        wrong: list[str] = []
        for i in range(10):
            name = f"cut-{kind}-{how}-{i}"
            hold = CUT_KINDS[kind](client, name)
            if how == "release":
                assert await hold.acquire()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0):
                        await hold.release()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None) as deadline:
                        async with hold:
                            # Due as the block ends: the exit's release is out when it fires.
                            deadline.reschedule(asyncio.get_running_loop().time())
            try:
                if hold.token is not None:
                    wrong.append(f"{i}: still holds after the cut release")
                if not await hold.acquire(timeout=5):
                    wrong.append(f"{i}: not acquired again")
                    continue
                await hold.release()
            except redmutex.LockError as err:
                wrong.append(f"{i}: {type(err).__name__}: {err}")
            # Nothing left behind: another client takes the name at once.
            probe = CUT_KINDS[kind](other_client, name)
            if not await probe.acquire(timeout=5):
                wrong.append(f"{i}: left held")
            else:
                await probe.release()
        return wrong

    wrong = asyncio.run(main())
    assert wrong == [], wrong


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", ["read", "write"])
def test_a_cut_release_on_the_runtime_leaves_the_task_holding_no_side_of_the_rwlock(
    make_server: Callable[..., Any], cut: str
) -> None:
    """A cut release that the runtime carries (always on Redlock; on one server while the loop's
    connection is being made) kept the RWLock's deadlock guard counting the task's hold until
    that release settled: the task's next write acquire raised "this task holds the write lock"
    or "read->write upgrade" (18 and 19 of 20 before). Now the guard lets go with the hold."""
    urls = [make_server().url for _ in range(2)]

    async def main(client: redmutex.Client) -> list[str]:
        wrong: list[str] = []
        for i in range(20):
            rw = aio.RWLock(client, f"cut-runtime-{cut}-{i}", ttl=30)
            side = rw.read() if cut == "read" else rw.write()
            assert await side.acquire()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0):
                    await side.release()
            try:
                writer = rw.write()
                if not await writer.acquire(timeout=5):
                    wrong.append(f"{i}: not acquired")
                else:
                    await writer.release()
            except redmutex.LockError as err:
                wrong.append(f"{i}: {err}")
        return wrong

    with redmutex.Client(urls) as client:
        wrong = asyncio.run(main(client))
    assert wrong == [], f"{len(wrong)} of 20: {wrong[:2]}"
