"""Issue 13 item 9: the in-process wait queues (gates) of different primitives never collide.

Only one waiter per primitive of a process competes in Redis; the others queue in process. The
queue of a Lock must not be the queue of a Semaphore or RWLock whose Redis key its name mimics.
"""

from __future__ import annotations

import time

import pytest
import redmutex
from _helpers import ResultThread

pytestmark = pytest.mark.timeout(60)


def test_lock_named_like_a_semaphore_key_does_not_hold_back_the_semaphore(redis_url: str) -> None:
    prefix = "gc:"
    c = redmutex.Client(redis_url, prefix=prefix)
    others = redmutex.Client(redis_url, prefix=prefix)
    mimic = "gc:{S}:sem:holders"  # the semaphore S's holders key, used as a lock name
    try:
        # The lock is held elsewhere, so a waiter of this process sits in its gate.
        lock_holder = redmutex.Lock(others, mimic, ttl=30)
        assert lock_holder.acquire(blocking=False)
        lock_waiter = ResultThread(lambda: redmutex.Lock(c, mimic, ttl=5).acquire(timeout=8))
        lock_waiter.start()
        time.sleep(0.3)
        # The only permit of S is taken elsewhere; a semaphore waiter of this process waits.
        sem_holder = redmutex.Semaphore(others, "S", 1, ttl=30, fair=False)
        assert sem_holder.acquire(blocking=False)

        def take_permit() -> float:
            sem = redmutex.Semaphore(c, "S", 1, ttl=5, fair=False)
            assert sem.acquire(timeout=8)
            got = time.monotonic()
            sem.release()
            return got

        sem_waiter = ResultThread(take_permit)
        sem_waiter.start()
        time.sleep(0.3)
        released_at = time.monotonic()
        sem_holder.release()  # a permit is free now: the semaphore waiter must get it promptly
        got = sem_waiter.outcome(15)
        assert isinstance(got, float)
        assert got - released_at < 1.5, (
            f"the semaphore waiter got the free permit only after {got - released_at:.2f} s "
            "(queued behind a Lock waiter)"
        )
        lock_holder.release()
        assert lock_waiter.outcome(15) is True
    finally:
        c.close()
        others.close()


def test_lock_named_like_an_rwlock_key_does_not_hold_back_the_writer(redis_url: str) -> None:
    prefix = "gw:"
    c = redmutex.Client(redis_url, prefix=prefix)
    others = redmutex.Client(redis_url, prefix=prefix)
    mimic = "gw:{W}:rw:writer"
    try:
        lock_holder = redmutex.Lock(others, mimic, ttl=30)
        assert lock_holder.acquire(blocking=False)
        lock_waiter = ResultThread(lambda: redmutex.Lock(c, mimic, ttl=5).acquire(timeout=8))
        lock_waiter.start()
        time.sleep(0.3)
        writer_holder = redmutex.RWLock(others, "W", ttl=30).write()
        assert writer_holder.acquire(blocking=False)

        def take_write() -> float:
            writer = redmutex.RWLock(c, "W", ttl=5).write()
            assert writer.acquire(timeout=8)
            got = time.monotonic()
            writer.release()
            return got

        write_waiter = ResultThread(take_write)
        write_waiter.start()
        time.sleep(0.3)
        released_at = time.monotonic()
        writer_holder.release()
        got = write_waiter.outcome(15)
        assert isinstance(got, float)
        assert got - released_at < 1.5, f"the writer waited {got - released_at:.2f} s"
        lock_holder.release()
        assert lock_waiter.outcome(15) is True
    finally:
        c.close()
        others.close()
