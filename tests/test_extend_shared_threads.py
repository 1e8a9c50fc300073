"""One lock object shared by threads (API.md: every object is safe to share between threads):
`extend()` while another thread reads `remaining()`, or while the object's own release runs.

- An extend that had to wait for a renewal (or another thread's) extend ran Python's signal
  handlers, taking the GIL, while it held the lock that `remaining()` takes under the GIL: the
  whole interpreter froze, renewal with it, and the lease ran out unreported (8 of 8 in the
  audit's script). The script runs here in a child interpreter with a watchdog.
- An extend that Redis refused because the object's own release ran first marked the hold lost.

Every redis-server here is the session's; child processes are bounded by their timeout.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redmutex
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)

# Runs KIND for SECONDS: threads extending an auto-renewed hold, one reading remaining(), and a
# SIGALRM handler reading it too; a watchdog (faulthandler) ends a frozen interpreter with 1.
_SCRIPT = textwrap.dedent(
    """
    import faulthandler, signal, sys, threading, time, uuid
    import redmutex

    url, kind, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = redmutex.Client(url)
    name = "shared-" + uuid.uuid4().hex[:8]
    if kind == "lock":
        held = redmutex.Lock(client, name, ttl=0.3, auto_renew=True)
    elif kind == "semaphore":
        held = redmutex.Semaphore(client, name, 2, ttl=0.3, auto_renew=True)
    else:
        held = redmutex.Lock(client, name, ttl=0.3, auto_renew=True, fair=True)
    assert held.acquire(timeout=5)
    stop = time.monotonic() + seconds
    counts = {"extend": 0, "remaining": 0, "handler": 0, "lapsed": 0}

    def extender():
        while time.monotonic() < stop:
            try:
                held.extend()
            except redmutex.LockLostError:
                # A 0.3 s lease may lapse on a starved machine: reported, not a freeze.
                assert held.lost
                counts["lapsed"] = 1
                return
            counts["extend"] += 1

    def reader():
        while time.monotonic() < stop:
            held.remaining()
            counts["remaining"] += 1

    def on_alarm(sig, frame):
        held.remaining()
        counts["handler"] += 1

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    faulthandler.dump_traceback_later(seconds + 15, exit=True)
    threads = [threading.Thread(target=f, daemon=True) for f in (extender, extender, reader)]
    for t in threads:
        t.start()
    extender()  # the main thread extends too, under the alarm
    for t in threads:
        t.join()
    signal.setitimer(signal.ITIMER_REAL, 0)
    faulthandler.cancel_dump_traceback_later()
    try:
        held.release()
    except redmutex.LockLostError:
        assert held.lost
    print("ok", counts)
    """
)


@pytest.mark.parametrize("kind", ["lock", "semaphore", "fair"])
def test_extend_with_remaining_read_meanwhile_never_freezes(
    redis_server: RedisServer, kind: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, redis_server.url, kind, "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout


@pytest.mark.parametrize("kind", ["lock", "semaphore", "rwlock write", "multilock"])
def test_an_extend_racing_the_objects_own_release_is_not_a_loss(
    client: redmutex.Client, kind: str
) -> None:
    """A heartbeat thread extends the object while the block leaves: the release got there
    first, so the extend is refused as not owned, and the block's exit is clean. The extend
    marked the hold lost, and the exit raised LockLostError (23 of 100 in the audit's script),
    though nobody else touched the name."""
    makers: dict[str, Callable[[str], Any]] = {
        "lock": lambda n: redmutex.Lock(client, n, ttl=5),
        "semaphore": lambda n: redmutex.Semaphore(client, n, 2, ttl=5),
        "rwlock write": lambda n: redmutex.RWLock(client, n, ttl=5).write(),
        "multilock": lambda n: redmutex.MultiLock(client, [n, n + "-b"], ttl=5),
    }
    losses: list[str] = []
    for i in range(40):
        held = makers[kind](f"heartbeat-{i}")
        done = threading.Event()

        def heartbeat(held: Any = held, done: threading.Event = done) -> None:
            while not done.is_set():
                try:
                    held.extend()
                except redmutex.LockNotOwnedError:
                    pass
                except redmutex.LockError as exc:
                    losses.append(f"heartbeat: {exc!r}")

        beating = threading.Thread(target=heartbeat)
        try:
            with held:
                beating.start()
                time.sleep(0.01)
        except redmutex.LockLostError as exc:
            losses.append(f"exit: {exc!r}")
        finally:
            done.set()
            beating.join(10)
        if held.lost:
            losses.append("lost")
    assert losses == []
