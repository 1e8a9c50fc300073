"""A dead waiting writer of an RWLock: a writer that waits behind a reader is killed and the
reader leaves, so nobody holds the RWLock while the dead writer's place (its ttl, 1 s to 6 s)
still holds new readers back. Shared by the tests of what `status` and `release --force` do
about such a place."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import redmutex
from _helpers import wait_until

if TYPE_CHECKING:
    from conftest import PyProcs

WAITING_WRITER = r"""
import sys, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
writer = redmutex.RWLock(client, sys.argv[3], ttl=10).write()
print("waiting", flush=True)
writer.acquire(timeout=60)
"""


def leave_a_dead_waiting_writer(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
    procs: PyProcs,
    redis_url: str,
    prefix: str,
    name: str,
) -> bytes:
    """Leaves only a dead writer's place under `name` (checked: a reader is refused) and returns
    the key of the waiting writers' places."""
    reader = redmutex.RWLock(client, name, ttl=10).read()
    assert reader.acquire(timeout=5)  # the read lock the writer waits for
    child = procs.start(WAITING_WRITER, redis_url, prefix, name)
    assert child.stdout is not None and child.stdout.readline().strip() == "waiting"
    waiting = key_of(name, "rw:writers_waiting")
    wait_until(lambda: int(r.zcard(waiting)) == 1, 10, "the writer's place")
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    reader.release()
    assert not redmutex.RWLock(client, name, ttl=10).read().acquire(timeout=0)
    return waiting
