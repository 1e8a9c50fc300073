"""Issue 3, `fair=True`: waiters are served in the order they started waiting, across threads and
processes; a waiter that dies stops holding its place within 10 s (the implementation lets a
silent place lapse after 6 s); one that times out or gives up leaves the queue at once; nothing
but the fence counter is left once everybody released.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import wait_until as _wait_until

if TYPE_CHECKING:
    from conftest import MpProcs

KeyOf = Callable[[str, str], bytes]

# Contract: a dead waiter stops holding its place within 10 s.
DEAD_PLACE_BOUND = 10.0


def _name_keys(r: redis.Redis, prefix: str, name: str) -> set[bytes]:
    head = (prefix + "{" + name + "}").encode()
    return {k for k in r.scan_iter(match=head + b"*", count=1000) if k.startswith(head)}


@pytest.fixture
def queue_len(r: redis.Redis, key_of: KeyOf) -> Callable[[str], int]:
    """queue_len(name): waiters in the Redis queue `prefix{name}:lock:queue`."""

    def _len(name: str) -> int:
        return int(r.hlen(key_of(name, "lock:queue")))

    return _len


class _Recorder:
    """Acquire, note (index, fence, time), hold briefly, release: run by each waiter."""

    def __init__(self) -> None:
        self.grants: list[tuple[int, int, float]] = []
        self.lock = threading.Lock()

    def run(self, index: int, lk: redmutex.Lock, timeout: float, hold: float = 0.05) -> bool:
        if not lk.acquire(timeout=timeout):
            return False
        assert lk.fence is not None
        with self.lock:
            self.grants.append((index, lk.fence, time.monotonic()))
        time.sleep(hold)
        lk.release()
        return True

    def order(self) -> list[int]:
        return [index for index, _, _ in sorted(self.grants, key=lambda g: g[1])]


# ------------------------------------------------------------------------ arrival order


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared_client", [True, False], ids=["one-client", "client-each"])
def test_threads_served_in_arrival_order(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    queue_len: Callable[[str], int],
    shared_client: bool,
) -> None:
    n = 6
    clients = [client] * n
    if not shared_client:
        clients = [redmutex.Client(redis_url, prefix=prefix) for _ in range(n)]
    try:
        holder = redmutex.Lock(client, "fifo", ttl=30, fair=True)
        assert holder.acquire(timeout=5)
        rec = _Recorder()
        threads: list[_Thread] = []
        for i in range(n):
            lk = redmutex.Lock(clients[i], "fifo", ttl=30, fair=True)
            th = _Thread(lambda i=i, lk=lk: rec.run(i, lk, 60))  # type: ignore[misc]
            th.start()
            threads.append(th)
            # staggered: the next one starts once this one has its place in the queue
            _wait_until(lambda i=i: queue_len("fifo") == i + 1, 20, f"waiter {i} to queue")  # type: ignore[misc]
            time.sleep(0.05)
        holder.release()
        for th in threads:
            assert th.outcome(60) is True
        assert rec.order() == list(range(n)), rec.grants
        assert _name_keys(r, prefix, "fifo") == {(prefix + "{fifo}:fence").encode()}
    finally:
        if not shared_client:
            for c in clients:
                c.close()


def _process_waiter(
    url: str, prefix: str, name: str, index: int, hold: float, out: Connection
) -> None:
    c = redmutex.Client(url, prefix=prefix)
    lk = redmutex.Lock(c, name, ttl=30, fair=True)
    if not lk.acquire(timeout=90):
        out.send((index, None, time.monotonic()))
        return
    out.send((index, lk.fence, time.monotonic()))
    time.sleep(hold)
    lk.release()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_served_in_arrival_order(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    queue_len: Callable[[str], int],
    mp_procs: MpProcs,
    method: str,
) -> None:
    n = 4
    recv, send = mp_procs.ctx(method).Pipe(duplex=False)
    holder = redmutex.Lock(client, "pfifo", ttl=60, fair=True)
    assert holder.acquire(timeout=5)
    children = []
    for i in range(n):
        children.append(
            mp_procs.start(
                _process_waiter, redis_url, prefix, "pfifo", i, 0.05, send, method=method
            )
        )
        _wait_until(lambda i=i: queue_len("pfifo") == i + 1, 60, f"process {i} to queue")  # type: ignore[misc]
        time.sleep(0.05)
    holder.release()
    grants: list[tuple[int, int | None, float]] = []
    for _ in range(n):
        assert recv.poll(60), f"only {len(grants)} of {n} processes reported"
        grants.append(recv.recv())
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert all(fence is not None for _, fence, _ in grants), grants
    by_fence = [index for index, _, _ in sorted(grants, key=lambda g: g[1] or 0)]
    assert by_fence == list(range(n)), grants
    assert _name_keys(r, prefix, "pfifo") == {(prefix + "{pfifo}:fence").encode()}


@pytest.mark.timeout(60)
def test_newcomer_does_not_barge_past_queue(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
    mp_procs: MpProcs,
) -> None:
    """A fair lock released while somebody waits goes to that waiter, not to a fresh try: the
    release grants it to the waiter at once (the lock key names the waiter's token). The waiter
    is a process paused (SIGSTOP) for half a second, well within its grant, so the window in
    which a barging peer would win stays open."""
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    holder = redmutex.Lock(client, "barge", ttl=30, fair=True)
    assert holder.acquire(timeout=5)
    released_fence = holder.fence
    assert released_fence is not None
    waiter = mp_procs.start(_process_waiter, redis_url, prefix, "barge", 0, 0.0, send)
    assert waiter.pid is not None
    _wait_until(lambda: queue_len("barge") == 1, 60, "the waiter to queue")
    time.sleep(0.2)
    os.kill(waiter.pid, signal.SIGSTOP)
    try:
        holder_token = holder.token
        holder.release()
        newcomer = redmutex.Lock(client, "barge", ttl=30, fair=True)
        granted_to = r.get(key_of("barge", "lock"))
        assert granted_to is not None and granted_to.decode() != holder_token  # granted...
        assert queue_len("barge") == 0  # ...to the waiter, which left the queue with it
        for _ in range(5):
            assert holder.acquire(timeout=0) is False  # not for the releaser
            assert newcomer.acquire(timeout=0) is False  # nor for a newcomer
            assert r.get(key_of("barge", "lock")) == granted_to
            time.sleep(0.1)
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
    assert recv.poll(20), "the queued waiter did not get the lock"
    index, fence, _ = recv.recv()
    assert index == 0 and fence > released_fence
    waiter.join(20)
    assert waiter.exitcode == 0
    assert newcomer.acquire(timeout=5) is True
    assert newcomer.fence is not None and newcomer.fence > fence
    newcomer.release()


# ------------------------------------------------------------------ waiters that leave


@pytest.mark.timeout(120)
def test_killed_queued_waiter_does_not_hold_back_others(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
    mp_procs: MpProcs,
) -> None:
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    holder = redmutex.Lock(client, "dead", ttl=60, fair=True)
    assert holder.acquire(timeout=5)
    doomed = mp_procs.start(_process_waiter, redis_url, prefix, "dead", 0, 0.0, send)
    _wait_until(lambda: queue_len("dead") == 1, 60, "the doomed process to queue")
    rec = _Recorder()
    threads: list[_Thread] = []
    for i in (1, 2):
        lk = redmutex.Lock(client, "dead", ttl=30, fair=True)
        th = _Thread(lambda i=i, lk=lk: rec.run(i, lk, 60))  # type: ignore[misc]
        th.start()
        threads.append(th)
        _wait_until(lambda i=i: queue_len("dead") == i + 1, 20, f"waiter {i} to queue")  # type: ignore[misc]
    time.sleep(1.0)
    mp_procs.kill(doomed)
    killed_at = time.monotonic()
    assert doomed.exitcode == -signal.SIGKILL
    assert not recv.poll(0), "the killed waiter had acquired"
    holder.release()
    # The dead waiter is still first (its place has not lapsed yet): the release grants it the
    # lock, for at most its place's time left plus a slack, which the bound below covers.
    assert r.exists(key_of("dead", "lock")) == 1
    for th in threads:
        assert th.outcome(60) is True
    assert rec.order() == [1, 2], rec.grants
    first_at = min(at for _, _, at in rec.grants)
    print(f"\nfirst live waiter served {first_at - killed_at:.3f} s after the queued one died")
    assert first_at - killed_at <= DEAD_PLACE_BOUND + 1.5, first_at - killed_at
    assert _name_keys(r, prefix, "dead") == {(prefix + "{dead}:fence").encode()}


@pytest.mark.timeout(60)
def test_timed_out_waiter_leaves_queue_at_once(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
) -> None:
    holder = redmutex.Lock(client, "gone", ttl=30, fair=True)
    assert holder.acquire(timeout=5)
    quitter = redmutex.Lock(client, "gone", ttl=30, fair=True)
    q_th = _Thread(lambda: quitter.acquire(timeout=1.5))
    q_th.start()
    _wait_until(lambda: queue_len("gone") == 1, 20, "the quitter to queue")
    stayer = redmutex.Lock(client, "gone", ttl=30, fair=True)
    s_th = _Thread(lambda: stayer.acquire(timeout=30))
    s_th.start()
    _wait_until(lambda: queue_len("gone") == 2, 20, "the stayer to queue")
    assert q_th.outcome(20) is False
    # acquire() returned: its place is gone already, the stayer's is left
    assert queue_len("gone") == 1
    assert r.hlen(key_of("gone", "lock:queue")) == 1
    assert quitter.token is None
    time.sleep(0.2)
    released_at = time.monotonic()
    holder.release()
    assert s_th.outcome(20) is True
    assert s_th.finished_at is not None
    # served at once, not when the quitter's place would have lapsed
    assert s_th.finished_at - released_at < 2.0, s_th.finished_at - released_at
    stayer.release()
    assert _name_keys(r, prefix, "gone") == {key_of("gone", "fence")}


@pytest.mark.timeout(60)
def test_timed_out_head_hands_on_to_next(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
) -> None:
    """The head of the queue gives up while the lock is held; the one behind it is next."""
    holder = redmutex.Lock(client, "head", ttl=30, fair=True)
    assert holder.acquire(timeout=5)
    head = redmutex.Lock(client, "head", ttl=30, fair=True)
    h_th = _Thread(lambda: head.acquire(timeout=1.0))
    h_th.start()
    _wait_until(lambda: queue_len("head") == 1, 20, "the head to queue")
    second = redmutex.Lock(client, "head", ttl=30, fair=True)
    s_th = _Thread(lambda: second.acquire(timeout=30))
    s_th.start()
    _wait_until(lambda: queue_len("head") == 2, 20, "the second to queue")
    assert h_th.outcome(20) is False
    holder.release()
    released_at = time.monotonic()
    assert s_th.outcome(20) is True
    assert s_th.finished_at is not None
    assert s_th.finished_at - released_at < 2.0
    second.release()
    assert _name_keys(r, prefix, "head") == {key_of("head", "fence")}


class _Interrupted(Exception):
    pass


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted


@pytest.mark.timeout(60)
def test_interrupted_waiter_leaves_queue(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
) -> None:
    """A waiter that gives up (Ctrl-C-like exception in a blocked acquire) leaves its place."""
    assert threading.current_thread() is threading.main_thread()
    holder = redmutex.Lock(client, "intr", ttl=30, fair=True)
    assert holder.acquire(timeout=5)
    lk = redmutex.Lock(client, "intr", ttl=30, fair=True)
    old = signal.signal(signal.SIGUSR1, _raise_interrupted)
    try:
        poke = threading.Thread(
            target=lambda: (
                _wait_until(lambda: queue_len("intr") == 1, 20, "the waiter to queue"),
                time.sleep(0.2),
                os.kill(os.getpid(), signal.SIGUSR1),
            ),
            daemon=True,
        )
        poke.start()
        with pytest.raises(_Interrupted):
            lk.acquire(timeout=30)
        poke.join(5)
    finally:
        signal.signal(signal.SIGUSR1, old)
    gave_up_at = time.monotonic()
    _wait_until(lambda: queue_len("intr") == 0, 2.0, "the interrupted waiter to leave")
    print(f"\nplace freed {time.monotonic() - gave_up_at:.3f} s after the interrupt")
    assert lk.token is None
    holder.release()
    time.sleep(0.3)
    assert r.exists(key_of("intr", "lock")) == 0  # the interrupted acquire never took it
    assert _name_keys(r, prefix, "intr") == {key_of("intr", "fence")}


@pytest.mark.timeout(60)
def test_fair_keys_gone_after_everybody_released(
    client: redmutex.Client, r: redis.Redis, prefix: str, key_of: KeyOf
) -> None:
    rec = _Recorder()
    locks = [redmutex.Lock(client, "clean", ttl=10, fair=True) for _ in range(8)]
    threads = [_Thread(lambda i=i, lk=lk: rec.run(i, lk, 30, 0.02)) for i, lk in enumerate(locks)]  # type: ignore[misc]
    for th in threads:
        th.start()
    for th in threads:
        assert th.outcome(40) is True
    fences = sorted(f for _, f, _ in rec.grants)
    assert len(set(fences)) == 8, fences  # one fence per grant, none repeated
    assert _name_keys(r, prefix, "clean") == {key_of("clean", "fence")}


# -------------------------------------------------------------- grant on release
# A release hands a fair lock straight to the first live waiter: the lock key names the
# waiter's token at once, and the waiter takes the hold from the published grant. The grant's
# lease is at most the waiter's place left in the queue (6 s) plus a slack (3 s), and is topped
# up to the full ttl at half of it.

GRANT_BOUND = 6.0 + 3.0  # place + slack: the longest lease a release grants


@pytest.mark.timeout(60)
def test_granted_waiters_get_increasing_fences_and_a_sane_lease(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
) -> None:
    n = 5
    holder = redmutex.Lock(client, "grant", ttl=10, fair=True)
    assert holder.acquire(timeout=5)
    assert holder.fence is not None
    first = holder.fence
    seen: list[tuple[int, int, float, float]] = []
    seen_lock = threading.Lock()

    def run(index: int, lk: redmutex.Lock) -> None:
        assert lk.acquire(timeout=30)
        left, fence = lk.remaining(), lk.fence
        assert left is not None and fence is not None
        with seen_lock:
            seen.append((index, fence, left, time.monotonic()))
        time.sleep(0.02)
        lk.release()

    threads = []
    for i in range(n):
        lk = redmutex.Lock(client, "grant", ttl=10, fair=True)
        th = _Thread(lambda i=i, lk=lk: run(i, lk))  # type: ignore[misc]
        th.start()
        threads.append(th)
        _wait_until(lambda i=i: queue_len("grant") == i + 1, 20, f"waiter {i} to queue")  # type: ignore[misc]
    holder.release()
    for th in threads:
        th.outcome(30)
    by_fence = sorted(seen, key=lambda s: s[1])
    assert [index for index, _, _, _ in by_fence] == list(range(n)), seen
    fences = [fence for _, fence, _, _ in by_fence]
    assert fences[0] > first and len(set(fences)) == n, seen
    for _, _, left, _ in seen:
        # Granted, not taken: at most place + slack (< ttl), counted from an attempt before.
        assert 2.0 < left <= GRANT_BOUND, seen
    assert _name_keys(r, prefix, "grant") == {key_of("grant", "fence")}


@pytest.mark.timeout(60)
def test_a_short_grant_is_topped_up_to_the_ttl(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, queue_len: Callable[[str], int]
) -> None:
    holder = redmutex.Lock(client, "topup", ttl=10, fair=True)
    assert holder.acquire(timeout=5)
    waiter = redmutex.Lock(client, "topup", ttl=10, fair=True)
    th = _Thread(lambda: waiter.acquire(timeout=20))
    th.start()
    _wait_until(lambda: queue_len("topup") == 1, 20, "the waiter to queue")
    holder.release()
    assert th.outcome(20) is True
    granted_at = time.monotonic()
    left = waiter.remaining()
    assert left is not None and left <= GRANT_BOUND, left  # a grant, shorter than the ttl
    time.sleep(6.0)
    # Topped up at half the grant: a full ttl from then.
    left = waiter.remaining()
    assert left is not None and left > 5.0, left
    assert waiter.lost is False
    time.sleep(max(0.0, granted_at + GRANT_BOUND + 0.5 - time.monotonic()))
    # Past the longest grant, still held, in Redis too.
    assert waiter.owned() is True
    assert int(r.pttl(key_of("topup", "lock"))) > 0
    waiter.release()
    assert waiter.lost is False


@pytest.mark.timeout(60)
def test_a_grant_found_gone_at_top_up_is_reported_lost(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, queue_len: Callable[[str], int]
) -> None:
    told: list[redmutex.Lock] = []
    holder = redmutex.Lock(client, "gone-grant", ttl=10, fair=True)
    assert holder.acquire(timeout=5)
    waiter = redmutex.Lock(client, "gone-grant", ttl=10, fair=True, on_lost=told.append)
    th = _Thread(lambda: waiter.acquire(timeout=20))
    th.start()
    _wait_until(lambda: queue_len("gone-grant") == 1, 20, "the waiter to queue")
    holder.release()
    assert th.outcome(20) is True
    r.delete(key_of("gone-grant", "lock"))  # the lease is lost behind the holder's back
    _wait_until(lambda: waiter.lost, GRANT_BOUND, "the top-up to find the lock gone")
    _wait_until(lambda: told == [waiter], 5, "on_lost to be called")
    with pytest.raises(redmutex.LockLostError):
        waiter.release()


@pytest.mark.timeout(120)
def test_waiters_timing_out_as_they_are_granted_leave_nothing_behind(
    client: redmutex.Client, r: redis.Redis, prefix: str, key_of: KeyOf
) -> None:
    """A waiter whose timeout ends while a release grants it the lock gives the grant back and
    hands the lock on: nobody is held back by a waiter that has gone."""
    rounds, outcomes = 30, {True: 0, False: 0}
    for i in range(rounds):
        name = f"race{i}"
        holder = redmutex.Lock(client, name, ttl=10, fair=True)
        assert holder.acquire(timeout=5)
        quick = redmutex.Lock(client, name, ttl=10, fair=True)
        patient = redmutex.Lock(client, name, ttl=10, fair=True)
        q_th = _Thread(lambda quick=quick: quick.acquire(timeout=0.15))  # type: ignore[misc]
        q_th.start()
        queue = key_of(name, "lock:queue")
        _wait_until(
            lambda queue=queue, q_th=q_th: r.hlen(queue) == 1 or q_th.finished_at is not None,  # type: ignore[misc]
            20,
            "the quick one",
        )
        p_th = _Thread(lambda patient=patient: patient.acquire(timeout=20))  # type: ignore[misc]
        p_th.start()
        # Behind the quick one; or alone, when a starved machine let the quick one time out
        # first (that round then only checks that the patient one is served).
        _wait_until(
            lambda queue=queue, q_th=q_th: (
                r.hlen(queue) == 2  # type: ignore[misc]
                or (q_th.finished_at is not None and r.hlen(queue) == 1)
            ),
            20,
            "the patient one",
        )
        # Release around the quick one's deadline (it started waiting a little earlier).
        time.sleep(0.08 + 0.004 * (i % 20))
        holder.release()
        got = q_th.outcome(20)
        assert isinstance(got, bool)
        outcomes[got] += 1
        if got:
            quick.release()
        else:
            assert quick.token is None
        # Whatever the quick one did, the patient one is served at once.
        assert p_th.outcome(5) is True
        assert patient.owned() is True
        patient.release()
        assert _name_keys(r, prefix, name) == {key_of(name, "fence")}, outcomes
    print(f"\nquick waiter: acquired {outcomes[True]}, timed out {outcomes[False]}")


@pytest.mark.timeout(60)
def test_a_grant_is_published_to_the_waiters_process_only(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    queue_len: Callable[[str], int],
) -> None:
    """The grant goes to the inbox of the waiter's client (`{N}:wake:<hex id>`), not to the lock's
    wake channel that every waiting process listens to, and says '<token> <fence> <lease ms>'."""
    other = redmutex.Client(redis_url, prefix=prefix)
    listener = r.pubsub()
    try:
        wake = key_of("inbox", "wake")
        listener.subscribe(wake)
        listener.psubscribe(wake + b":*")
        for _ in range(2):  # the two confirmations
            assert listener.get_message(timeout=5) is not None
        holder = redmutex.Lock(client, "inbox", ttl=10, fair=True)
        assert holder.acquire(timeout=5)
        waiter = redmutex.Lock(other, "inbox", ttl=10, fair=True)
        th = _Thread(lambda: waiter.acquire(timeout=20))
        th.start()
        _wait_until(lambda: queue_len("inbox") == 1, 20, "the waiter to queue")
        holder.release()
        assert th.outcome(20) is True
        msg = listener.get_message(timeout=5)
        assert msg is not None and msg["type"] == "pmessage", msg
        channel, payload = msg["channel"], msg["data"]
        assert channel.startswith(wake + b":")
        inbox = channel[len(wake) + 1 :]
        assert len(inbox) == 16 and all(c in b"0123456789abcdef" for c in inbox), channel
        token, fence, lease_ms = payload.split(b" ")
        assert token.decode() == waiter.token
        assert int(fence) == waiter.fence
        assert 0 < int(lease_ms) <= 10_000
        waiter.release()  # nobody waits: '' on the wake channel
        msg = listener.get_message(timeout=5)
        assert msg is not None and (msg["channel"], msg["data"]) == (wake, b""), msg
        assert listener.get_message(timeout=0.2) is None
        assert _name_keys(r, prefix, "inbox") == {key_of("inbox", "fence")}
    finally:
        listener.close()
        other.close()


@pytest.mark.timeout(120)
def test_waiters_cancelled_as_they_are_granted_leave_nothing_behind(
    client: redmutex.Client, r: redis.Redis, prefix: str, key_of: KeyOf
) -> None:
    """asyncio: a waiting acquire cancelled around the moment a release grants it the lock gives
    the grant back (in the background) and the lock is free for anybody soon after."""
    import asyncio
    import random

    from redmutex import aio

    rng = random.Random(11)
    got_it = 0

    async def main() -> None:
        nonlocal got_it
        for i in range(150):
            name = f"cancel{i % 5}"
            holder = aio.Lock(client, name, ttl=10, fair=True)
            assert await holder.acquire(timeout=5)
            waiter = aio.Lock(client, name, ttl=10, fair=True)
            task = asyncio.create_task(waiter.acquire(timeout=10))
            while r.hlen(key_of(name, "lock:queue")) == 0:
                await asyncio.sleep(0.001)
            release = asyncio.create_task(holder.release())
            # Cancel before the release ran, about when the grant arrives, or after.
            delay = rng.choice([0.0, 0.0002, 0.0005, 0.001, 0.002]) * rng.random()
            if delay:
                await asyncio.sleep(delay)
            task.cancel()
            try:
                got = await task
            except asyncio.CancelledError:
                got = False
            await release
            if got:
                got_it += 1
                await waiter.release()
            # The lock is free again at once, or as soon as the cancelled one's undo has run.
            probe = aio.Lock(client, name, ttl=10, fair=True)
            assert await probe.acquire(timeout=3), f"round {i}: the lock stayed taken"
            await probe.release()

    asyncio.run(main())
    print(f"\ncancelled waiter acquired anyway in {got_it} of 150 rounds")
    assert got_it < 150  # some were cancelled in time
    for i in range(5):
        _wait_until(
            lambda i=i: _name_keys(r, prefix, f"cancel{i}") == {key_of(f"cancel{i}", "fence")},  # type: ignore[misc]
            5,
            "only the fence to be left",
        )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "unfair"])
@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_a_waiter_that_waited_longer_than_its_ttl_gets_a_whole_lease(
    client: redmutex.Client, fair: bool, api: str
) -> None:
    """A waiter (ttl 0.6 s) is handed the lock by a release 1.5 s after it began to wait. Its
    lease counted from its last attempt that found the lock held, up to a place refresh ago
    (2 s fair, 0.67 s unfair): `remaining()` said 0 and, with auto_renew, the hold was reported
    lost at once while Redis gave it a whole lease (3 of 3 runs before, each way)."""
    import asyncio

    from redmutex import aio

    name = f"long-wait-{fair}-{api}"
    holder = redmutex.Lock(client, name, ttl=5, fair=fair)
    assert holder.acquire()
    threading.Timer(1.5, holder.release).start()
    lost: list[object] = []
    if api == "blocking":
        waiter = redmutex.Lock(
            client, name, ttl=0.6, fair=fair, auto_renew=True, on_lost=lost.append
        )
        assert waiter.acquire(timeout=10)
        left, owned = waiter.remaining() or 0.0, waiter.owned()
        time.sleep(1.0)  # renewal keeps it
        assert not waiter.lost and lost == []
        waiter.release()
    else:

        async def main() -> tuple[float, bool]:
            waiter = aio.Lock(client, name, ttl=0.6, fair=fair, auto_renew=True)
            assert await waiter.acquire(timeout=10)
            left, owned = waiter.remaining() or 0.0, await waiter.owned()
            await asyncio.sleep(1.0)
            assert not waiter.lost
            await waiter.release()
            return left, owned

        left, owned = asyncio.run(main())
    assert owned and left > 0.3, f"remaining() {left:.3f} s of a 0.6 s lease just granted"
