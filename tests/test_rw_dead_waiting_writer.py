"""A writer that dies while waiting for the write lock. Its waiting place holds new readers back
(writer preference) until the place lapses; contract: dead readers and writers stop counting
when their ttl ends. The place lasted 6 s whatever the ttl, so a dead waiting writer kept every
new reader out for about 5.5 s (in 4 of 4 runs with ttl=0.5). A writer's place now lasts its
ttl, at least 1 s (a live waiter refreshes it every third) and at most 6 s."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from _helpers import wait_until

if TYPE_CHECKING:
    from conftest import PyProcs

WAITING_WRITER = r"""
import sys, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
writer = redmutex.RWLock(client, sys.argv[3], ttl=float(sys.argv[4])).write()
print("waiting", flush=True)
writer.acquire(timeout=60)
"""
# The place of a writer with a ttl under 1 s lasts 1 s; slack for a noisy machine on top.
PLACE_FLOOR, SLACK = 1.0, 1.0
RUNS = 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ttl", [0.5, 1.5])
def test_a_dead_waiting_writer_stops_holding_readers_back_about_its_ttl_later(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
    procs: PyProcs,
    redis_url: str,
    prefix: str,
    ttl: float,
) -> None:
    waited = []
    for run in range(RUNS):
        name = f"dead-waiting-writer-{ttl}-{run}"
        reader = redmutex.RWLock(client, name, ttl=10).read()
        assert reader.acquire(timeout=5)  # the read lock the writer waits for
        child = procs.start(WAITING_WRITER, redis_url, prefix, name, str(ttl))
        assert child.stdout is not None and child.stdout.readline().strip() == "waiting"
        waiting = key_of(name, "rw:writers_waiting")
        wait_until(lambda waiting=waiting: int(r.zcard(waiting)) == 1, 10, "the writer's place")
        time.sleep(0.3)  # it waits (and may have refreshed its place)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        reader.release()  # nobody holds anything now; only the dead writer's place remains
        late = redmutex.RWLock(client, name, ttl=ttl).read()
        assert late.acquire(timeout=20)
        waited.append(time.monotonic() - killed)
        late.release()
    assert all(w < max(ttl, PLACE_FLOOR) + SLACK for w in waited), waited
