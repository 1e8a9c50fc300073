"""`python -m redmutex release NAME --force` drops the places of waiting RWLock writers. A
writer that died while waiting keeps new readers out until its place lapses (up to 6 s); the
forced release said "it is not held" and left that place, so readers stayed out (1 of 1 run
of the hunt's script). A live waiting writer takes its place again at its next refresh."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import redmutex
from _rw_dead_writer import leave_a_dead_waiting_writer

if TYPE_CHECKING:
    from conftest import PyProcs


def test_a_forced_release_drops_a_dead_waiting_writers_place(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
    procs: PyProcs,
    redis_url: str,
    prefix: str,
) -> None:
    name = "forced-waiting-writer"
    # Only the dead writer's place is left: a reader is held back.
    waiting = leave_a_dead_waiting_writer(client, r, key_of, procs, redis_url, prefix, name)
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "redmutex", "release", name, "--force", "--yes"]
        + ["--redis", redis_url, "--prefix", prefix],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=environment,
        timeout=30,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "1 waiting writer place" in done.stdout, done.stdout
    assert not r.exists(waiting)
    late = redmutex.RWLock(client, name, ttl=10).read()
    assert late.acquire(timeout=0)
    late.release()
