"""Issue 18 items 3 and 5: an unfair lock's blocking waiters wait in the fair queue.

A first attempt still takes a free lock past the queue (barging); once it found the lock taken
and the caller waits, the waiter joins the Redis queue and a release grants the lock to the first
live waiter, so no herd races for it and the releaser's next attempt does not take it back. A
waiter that gives up leaves the queue at once; one that died stops holding the others back
within its short place (`UNFAIR_QUEUE_PLACE`, 2 s) plus the grant slack (3 s).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import calls_delta as _delta
from _helpers import command_calls as _calls
from _helpers import wait_until as _wait_until
from redmutex import _core, aio

if TYPE_CHECKING:
    from conftest import MpProcs

KeyOf = Callable[[str, str], bytes]


@pytest.fixture
def other_client_factory(redis_url: str, prefix: str) -> Iterator[Callable[[], redmutex.Client]]:
    """Makes independent Clients (connections of their own) on the same prefix."""
    made: list[redmutex.Client] = []

    def make() -> redmutex.Client:
        c = redmutex.Client(redis_url, prefix=prefix)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()


# UNFAIR_QUEUE_PLACE (2 s) + GRANT_SLACK_MS (3 s): the longest a dead queued waiter holds the
# others back (a fair waiter's place is 6 s: up to 9 s).
DEAD_WAITER_BOUND = 2.0 + 3.0


def _queued_waiter(
    url: str, prefix: str, name: str, rounds: int, go: Connection, out: Connection
) -> None:
    """Each round: waits for the lock, reports, and holds it until told to release."""
    c = redmutex.Client(url, prefix=prefix)
    lock = redmutex.Lock(c, name, ttl=30)
    for _ in range(rounds):
        if not go.poll(60):
            return
        go.recv()
        got = lock.acquire(timeout=20)
        out.send(got)
        if not go.poll(60):
            return
        go.recv()
        if got:
            lock.release()
        out.send(True)


@pytest.mark.timeout(120)
def test_the_releaser_does_not_take_back_the_lock_from_a_queued_waiter(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    mp_procs: MpProcs,
) -> None:
    """A waiter of another process queues behind the holder; the holder releases and tries again
    at once (non-blocking, then blocking): the release granted the lock to the waiter, so neither
    attempt takes it back (with the herd, the releaser's attempt usually won)."""
    ctx = mp_procs.ctx("fork")
    go_recv, go_send = ctx.Pipe(duplex=False)
    out_recv, out_send = ctx.Pipe(duplex=False)
    rounds = 10
    child = mp_procs.start(_queued_waiter, redis_url, prefix, "fifo", rounds, go_recv, out_send)
    queue = key_of("fifo", "lock:queue")
    holder = redmutex.Lock(client, "fifo", ttl=30)
    barged = 0
    for _ in range(rounds):
        assert holder.acquire(timeout=20)  # the child may still be releasing the last round
        go_send.send(True)
        _wait_until(lambda: r.hlen(queue) == 1, 10, "the waiter to queue")
        holder.release()
        # (the waiter holds what it was granted until told: this try cannot find it released)
        if holder.acquire(blocking=False):
            barged += 1
            holder.release()
        assert out_recv.poll(25), "the waiting process did not report"
        got = out_recv.recv()
        go_send.send(True)
        assert out_recv.poll(25), "the waiting process did not release"
        out_recv.recv()
        assert got is True
    child.join(20)
    assert child.exitcode == 0
    assert barged == 0, f"the releaser took the lock back in {barged} of {rounds} rounds"
    assert r.exists(queue) == 0


@pytest.mark.timeout(60)
def test_a_blocking_reacquire_queues_behind_the_waiter(
    client: redmutex.Client, redis_url: str, prefix: str, r: redis.Redis, key_of: KeyOf
) -> None:
    """Threads of two Clients (two processes, as Redis sees them) alternate: each release grants
    the lock to the other side's queued waiter, whose acquire returns without another look."""
    other = redmutex.Client(redis_url, prefix=prefix)
    try:
        order: list[str] = []
        start = time.monotonic()

        def loop(c: redmutex.Client, who: str) -> None:
            lock = redmutex.Lock(c, "alternate", ttl=30)
            while len(order) < 40 and time.monotonic() - start < 20:
                assert lock.acquire(timeout=10)
                order.append(who)
                time.sleep(0.005)
                lock.release()

        threads = [_Thread(lambda: loop(client, "a")), _Thread(lambda: loop(other, "b"))]
        for th in threads:
            th.start()
        for th in threads:
            th.outcome(40)
        switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
        # Once both wait, every hand-off switches owner; a few at the start may not.
        assert switches >= len(order) - 4, order
        assert r.exists(key_of("alternate", "lock:queue")) == 0
    finally:
        other.close()


@pytest.mark.timeout(60)
def test_a_waiter_that_times_out_leaves_the_queue_and_a_try_never_joins(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: KeyOf,
) -> None:
    holder = redmutex.Lock(client, "leave", ttl=30)
    assert holder.acquire(timeout=5)
    waiter = redmutex.Lock(client, "leave", ttl=30)
    queue = key_of("leave", "lock:queue")
    th = _Thread(lambda: waiter.acquire(timeout=1.0))
    th.start()
    _wait_until(lambda: r.hlen(queue) == 1, 10, "the waiter to queue")
    assert th.outcome(20) is False
    assert r.hlen(queue) == 0
    assert r.exists(key_of("leave", "lock:queue")) == 0
    # Non-blocking and zero-timeout attempts only try: no HSET (a place taken) reaches Redis.
    before = _calls(r)
    assert waiter.acquire(blocking=False) is False
    assert waiter.acquire(timeout=0) is False
    delta = _delta(before, _calls(r))
    assert delta.get("hset", 0) == 0, delta
    assert r.exists(queue) == 0
    # The lock is handed on as before: the holder's release leaves nothing behind.
    holder.release()
    assert r.get(key_of("leave", "lock")) is None


def _dying_waiter(url: str, prefix: str, name: str, out: Connection) -> None:
    c = redmutex.Client(url, prefix=prefix)
    lock = redmutex.Lock(c, name, ttl=30)
    out.send("waiting")
    lock.acquire(timeout=120)
    time.sleep(120)


@pytest.mark.timeout(90)
def test_a_killed_queued_waiter_holds_the_others_back_briefly(
    client: redmutex.Client,
    other_client_factory: Callable[[], redmutex.Client],
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    mp_procs: MpProcs,
) -> None:
    """A waiter queued first in a subprocess is SIGKILLed; the holder releases (granting the
    lock to the dead waiter, whose place has not lapsed yet); the next queued waiter gets the
    lock within the dead one's place + the grant slack (plus a margin), not a lease or 9 s."""
    holder = redmutex.Lock(client, "dead-waiter", ttl=30)
    assert holder.acquire(timeout=5)
    queue = key_of("dead-waiter", "lock:queue")
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    dying = mp_procs.start(_dying_waiter, redis_url, prefix, "dead-waiter", send)
    assert recv.poll(30)
    _wait_until(lambda: r.hlen(queue) == 1, 20, "the doomed waiter to queue")
    other = other_client_factory()
    waiter = redmutex.Lock(other, "dead-waiter", ttl=30)
    th = _Thread(lambda: waiter.acquire(timeout=60))
    th.start()
    _wait_until(lambda: r.hlen(queue) == 2, 20, "the second waiter to queue behind")
    mp_procs.kill(dying)
    released_at = time.monotonic()
    holder.release()
    assert th.outcome(60) is True
    assert th.finished_at is not None
    took = th.finished_at - released_at
    print(f"\nserved {took:.3f} s after the release, past a dead queued waiter")
    assert took < DEAD_WAITER_BOUND + 2.5, took
    assert waiter.owned()
    waiter.release()


@pytest.mark.timeout(60)
def test_a_thread_behind_its_process_competitor_waits_without_a_first_attempt(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """One waiter per process and name queues in Redis; another thread of that process that
    comes to wait while it does queues in process behind it without asking Redis first (the
    lock is held, or about to be granted to that waiter), then gets the lock in its turn."""
    queue = key_of("behind", "lock:queue")
    holder = redmutex.Lock(client, "behind", ttl=30)
    assert holder.acquire(timeout=5)
    first, second = (redmutex.Lock(client, "behind", ttl=30) for _ in range(2))
    order: list[str] = []

    def waiter(lock: redmutex.Lock, label: str) -> bool:
        got = lock.acquire(timeout=20)
        order.append(label)
        time.sleep(0.05)
        lock.release()
        return got

    ahead = _Thread(lambda: waiter(first, "first"))
    ahead.start()
    _wait_until(lambda: r.hlen(queue) == 1, 10, "the first waiter to queue")
    before = _calls(r)
    behind = _Thread(lambda: waiter(second, "second"))
    behind.start()
    time.sleep(0.3)
    ran = _delta(before, _calls(r))
    # A first attempt (lock_acquire.lua) sends SET NX; the queued waiter's place refreshes
    # (which may fall in the window) find the lock held and send no SET.
    assert "set" not in ran, ran
    assert behind.finished_at is None and r.hlen(queue) == 1
    holder.release()
    assert ahead.outcome(20) is True
    assert behind.outcome(20) is True
    assert order == ["first", "second"]


async def _queued_acquire(lock: aio.Lock, r: redis.Redis, queue: bytes) -> asyncio.Future[bool]:
    """Starts `lock.acquire()` in a task and returns it once its waiter is the queue's only one."""
    task = asyncio.ensure_future(lock.acquire(timeout=20))
    deadline = time.monotonic() + 10
    while r.hlen(queue) != 1:
        assert time.monotonic() < deadline, "the asyncio waiter did not queue"
        await asyncio.sleep(0.005)
    return task


@pytest.mark.timeout(60)
def test_an_asyncio_waiter_is_granted_the_lock(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """redmutex.aio.Lock goes the same way: queued, granted by the release; the releaser's
    immediate try does not take it back."""
    holder = redmutex.Lock(client, "aio-queue", ttl=30)
    queue = key_of("aio-queue", "lock:queue")

    async def main() -> int:
        lock = aio.Lock(client, "aio-queue", ttl=30)
        loop = asyncio.get_running_loop()
        barged = 0
        for _ in range(5):
            assert await loop.run_in_executor(None, lambda: holder.acquire(timeout=10))
            task = await _queued_acquire(lock, r, queue)

            def release_and_try() -> bool:
                holder.release()
                took = holder.acquire(blocking=False)
                if took:
                    holder.release()
                return took

            barged += int(await loop.run_in_executor(None, release_and_try))
            assert await asyncio.wait_for(task, 20) is True
            await lock.release()
        return barged

    assert asyncio.run(main()) == 0


@pytest.mark.timeout(60)
def test_an_asyncio_waiter_that_found_the_lock_taken_joins_with_its_first_attempt(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """Like the blocking API's, an asyncio acquire whose object's last acquire found the lock
    taken listens first and joins the queue with its first attempt: granted by the release, it
    makes no attempt while waiting. An object's first acquire does not know yet: one attempt, to
    join. Each event loop's first acquire goes through the runtime while the loop's connection
    is made; that path notes what it found too, so the object's second acquire joins at once
    (before, it made one attempt more: [1, 1, 0] in every loop)."""
    holder = redmutex.Lock(client, "aio-early", ttl=30)
    queue = key_of("aio-early", "lock:queue")

    async def main() -> list[int]:
        lock = aio.Lock(client, "aio-early", ttl=30)
        loop = asyncio.get_running_loop()
        attempts = []
        for _ in range(3):
            assert await loop.run_in_executor(None, lambda: holder.acquire(timeout=10))
            before = _core._waiting_attempts()
            task = await _queued_acquire(lock, r, queue)
            await loop.run_in_executor(None, holder.release)
            assert await asyncio.wait_for(task, 20) is True
            attempts.append(_core._waiting_attempts() - before)
            await lock.release()
        return attempts

    loops = [asyncio.run(main()) for _ in range(3)]
    assert all(attempts[0] >= 1 for attempts in loops), loops
    # (a rare extra attempt, e.g. a place refresh on a slow machine, is seen on the blocking
    # path too)
    later = [n for attempts in loops for n in attempts[1:]]
    assert later.count(0) >= 5, loops


@pytest.mark.timeout(60)
def test_a_cancelled_asyncio_waiter_leaves_the_place_its_first_attempt_took(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """Cancelled once its first attempt joined the queue, an asyncio acquire leaves the queue
    at once (well before its place would lapse, 2 s) and the lock goes to nobody else."""
    holder = redmutex.Lock(client, "aio-early-cancel", ttl=30)
    queue = key_of("aio-early-cancel", "lock:queue")

    async def main() -> list[float]:
        lock = aio.Lock(client, "aio-early-cancel", ttl=30)
        loop = asyncio.get_running_loop()
        left_after = []
        for _ in range(4):
            assert await loop.run_in_executor(None, lambda: holder.acquire(timeout=10))
            task = await _queued_acquire(lock, r, queue)
            task.cancel()
            cancelled_at = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            while r.exists(queue):
                assert time.monotonic() - cancelled_at < 1.5, "the place was not left"
                await asyncio.sleep(0.005)
            left_after.append(time.monotonic() - cancelled_at)
            assert lock.token is None
            await loop.run_in_executor(None, holder.release)
            assert r.exists(key_of("aio-early-cancel", "lock")) == 0
        return left_after

    left_after = asyncio.run(main())
    assert max(left_after) < 1.5, left_after


@pytest.mark.timeout(90)
def test_mixed_waiters_all_get_the_lock(
    client: redmutex.Client,
    other_client_factory: Callable[[], redmutex.Client],
    r: redis.Redis,
    key_of: KeyOf,
) -> None:
    """A queued unfair waiter, a fair one and a racing one (the recipe's `acquire_lock`, woken
    by every release, as an unfair waiter of an earlier version was) on one name: each gets the
    lock in turn, nobody is stranded."""
    holder = redmutex.Lock(client, "mixed", ttl=30)
    assert holder.acquire(timeout=5)
    got: list[str] = []

    def queued(fair: bool) -> bool:
        lock = redmutex.Lock(other_client_factory(), "mixed", ttl=30, fair=fair)
        ok = lock.acquire(timeout=30)
        got.append("fair" if fair else "unfair")
        time.sleep(0.05)
        lock.release()
        return ok

    def racing() -> bool:
        ident = redmutex.acquire_lock(client, "mixed", atime=30, ltime=30)
        got.append("racing")
        time.sleep(0.05)
        return bool(ident) and redmutex.release_lock(client, "mixed", ident)

    threads = [_Thread(lambda: queued(False)), _Thread(lambda: queued(True)), _Thread(racing)]
    for th in threads:
        th.start()
    _wait_until(lambda: r.hlen(key_of("mixed", "lock:queue")) == 2, 10, "two waiters to queue")
    time.sleep(0.2)
    started = time.monotonic()
    holder.release()
    for th in threads:
        assert th.outcome(40) is True
    took = time.monotonic() - started
    assert sorted(got) == ["fair", "racing", "unfair"]
    # Released within moments of each other: nobody waited for a lease to end.
    assert took < 5.0, took
    assert r.exists(key_of("mixed", "lock:queue")) == 0
