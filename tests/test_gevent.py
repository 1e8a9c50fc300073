"""The blocking API under gevent's monkey-patching (gunicorn's and Celery's gevent workers): the
greenlets of a thread take turns on one OS thread, and `threading` calls each one a thread.
So a blocking call that waits must let the other greenlets run (the holder it waits for among
them), and a re-entrant lock or an RWLock must tell greenlets apart, as `threading.RLock` does
under the patching. Each scenario runs in a child process that patches before importing
redmutex, as gevent requires."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import PyProcs

PRELUDE = """
from gevent import monkey
monkey.patch_all()
import json, sys, time
import gevent, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
t0 = time.monotonic()
def now():
    return round(time.monotonic() - t0, 3)
"""


def run(procs: PyProcs, body: str, redis_url: str, prefix: str) -> Any:
    code, out, err = procs.run(PRELUDE + body, redis_url, prefix, timeout=90)
    assert code == 0, err
    assert "Traceback" not in err, err
    return json.loads(out)


WAITER = """
ticks, seen = [], {}
def holder():
    with redmutex.Lock(client, "g-wait", ttl=30):
        seen["held"] = now()
        gevent.sleep(0.5)
        seen["released"] = now()
def waiter():
    gevent.sleep(0.1)
    lock = redmutex.Lock(client, "g-wait", ttl=30)
    seen["acquired"] = lock.acquire(timeout=10)
    seen["acquired_at"] = now()
    lock.release()
def ticker():
    for _ in range(10):
        gevent.sleep(0.1)
        ticks.append(now())
gevent.joinall([gevent.spawn(f) for f in (holder, waiter, ticker)], raise_error=True)
print(json.dumps({"seen": seen, "ticks": ticks}))
"""


@pytest.mark.timeout(120)
def test_a_waiting_greenlet_lets_the_others_run(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    """Before: the waiter blocked the OS thread, so the holder could not release (the waiter
    timed out after 10 s) and the ticker stood still meanwhile."""
    result = run(procs, WAITER, redis_url, prefix)
    seen, ticks = result["seen"], result["ticks"]
    assert seen["acquired"] is True
    # Woken by the release, not by the lease's end (30 s); generous bound for a loaded machine.
    assert seen["acquired_at"] - seen["released"] < 2.0, seen
    # The ticker ticked while the waiter waited: no gap of a whole second between ticks.
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) == 10 and max(gaps) < 1.0, ticks


REENTRANT = """
inside, overlaps, nested = 0, 0, 0
def worker():
    global inside, overlaps, nested
    for _ in range(3):
        with redmutex.Lock(client, "g-re", ttl=30, reentrant=True, timeout=20) as lock:
            inside += 1
            overlaps += inside > 1
            with redmutex.Lock(client, "g-re", ttl=30, reentrant=True, timeout=0):
                nested += 1  # its own hold: re-entered at once
            gevent.sleep(0.02)
            inside -= 1
gevent.joinall([gevent.spawn(worker) for _ in range(4)], raise_error=True)
print(json.dumps({"overlaps": overlaps, "nested": nested}))
"""


@pytest.mark.timeout(120)
def test_a_reentrant_lock_is_owned_by_the_greenlet(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    """Before: every greenlet of the thread was its owner, so four of them held it at once."""
    result = run(procs, REENTRANT, redis_url, prefix)
    assert result == {"overlaps": 0, "nested": 12}


RWLOCK = """
rw = redmutex.RWLock(client, "g-rw", ttl=30)
order = []
def reader():
    with rw.read():
        order.append("read")
        gevent.sleep(0.3)
        order.append("read done")
def writer():
    gevent.sleep(0.1)
    with rw.write():
        order.append("write")
gevent.joinall([gevent.spawn(reader), gevent.spawn(writer)], raise_error=True)
print(json.dumps(order))
"""


@pytest.mark.timeout(120)
def test_an_rwlock_tells_greenlets_apart(procs: PyProcs, redis_url: str, prefix: str) -> None:
    """A writer greenlet waits for a reader greenlet through the same RWLock object. Before: the
    deadlock guard took them for one thread upgrading its read lock (LockError)."""
    assert run(procs, RWLOCK, redis_url, prefix) == ["read", "read done", "write"]


SEMAPHORE_AND_CACHE = """
sem_inside, sem_most, fills = 0, 0, 0
def permit():
    global sem_inside, sem_most
    with redmutex.Semaphore(client, "g-sem", 2, ttl=30, timeout=20):
        sem_inside += 1
        sem_most = max(sem_most, sem_inside)
        gevent.sleep(0.05)
        sem_inside -= 1
def fill():
    global fills
    fills += 1
    gevent.sleep(0.3)
    return 42
def read():
    return redmutex.get_or_fill(client, "g-cache", fill, ttl=30)
permits = [gevent.spawn(permit) for _ in range(6)]
reads = [gevent.spawn(read) for _ in range(8)]
gevent.joinall(permits + reads, raise_error=True)
print(json.dumps({"most": sem_most, "fills": fills, "values": [g.value for g in reads]}))
"""


@pytest.mark.timeout(120)
def test_semaphore_and_cache_waits_cooperate(procs: PyProcs, redis_url: str, prefix: str) -> None:
    result = run(procs, SEMAPHORE_AND_CACHE, redis_url, prefix)
    assert result == {"most": 2, "fills": 1, "values": [42] * 8}


THREADPOOL = """
def holder():
    with redmutex.Lock(client, "g-pool", ttl=30):
        gevent.sleep(0.3)
def pooled():
    gevent.sleep(0.05)
    lock = redmutex.Lock(client, "g-pool", ttl=30)
    # gevent's threadpool runs the call on a native thread (no hub there): its wait blocks that
    # thread only, while the hub runs the holder until it releases.
    acquired = gevent.get_hub().threadpool.apply(lock.acquire, (True, 10))
    held = lock.owned()
    lock.release()
    return {"acquired": acquired, "held": held, "at": now()}
g = gevent.spawn(pooled)
gevent.joinall([gevent.spawn(holder), g], raise_error=True)
print(json.dumps(g.value))
"""


@pytest.mark.timeout(120)
def test_a_wait_in_gevents_threadpool_blocks_only_its_thread(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    result = run(procs, THREADPOOL, redis_url, prefix)
    assert (result["acquired"], result["held"]) == (True, True)
    assert result["at"] < 5.0, result  # the release woke it (the lease is 30 s)


# redmutex imported and a Client made before the patching, as gunicorn's `--preload` does in the
# master before its gevent worker patches in the forked child.
PATCHED_LATER = """
import json, sys, time
import redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
redmutex.Lock(client, "g-later-warm", ttl=30).acquire(timeout=0)
from gevent import monkey
monkey.patch_all()
import gevent
seen = {}
def holder():
    with redmutex.Lock(client, "g-later", ttl=30, reentrant=True):
        gevent.sleep(0.3)
        seen["released"] = time.monotonic()
def waiter():
    gevent.sleep(0.05)
    with redmutex.Lock(client, "g-later", ttl=30, reentrant=True, timeout=10):
        seen["acquired"] = time.monotonic()
gevent.joinall([gevent.spawn(holder), gevent.spawn(waiter)], raise_error=True)
fills = 0
def fill():
    global fills
    fills += 1
    gevent.sleep(0.3)
    return 42
reads = [gevent.spawn(redmutex.get_or_fill, client, "g-later-cache", fill, ttl=30) for _ in range(4)]
gevent.joinall(reads, raise_error=True)
print(json.dumps({"gap": seen["acquired"] - seen["released"], "fills": fills,
                  "values": [g.value for g in reads]}))
"""


@pytest.mark.timeout(120)
def test_patching_after_the_client_was_made(procs: PyProcs, redis_url: str, prefix: str) -> None:
    code, out, err = procs.run(PATCHED_LATER, redis_url, prefix, timeout=90)
    assert code == 0, err
    result = json.loads(out)
    # The waiter got the lock after the holder's release, woken by it.
    assert 0 <= result["gap"] < 2.0, result
    # One greenlet filled; the others waited for it. (Before: redmutex, imported before the
    # patching, kept its fills per OS thread, so they were refused as asking from their own
    # fill.)
    assert (result["fills"], result["values"]) == (1, [42] * 4), result


# A signal whose handler raises (Ctrl-C's KeyboardInterrupt) lands in whatever Python code runs
# next; here, by a profile hook, in a given helper of `redmutex._greenlets` the core calls (the
# checks for gevent's patching and for the thread's hub before a wait, the greenlet as an owner).
INTERRUPTED_HELPER = """
import os, signal
target = sys.argv[3]
fired = []
def hook(frame, event, arg):
    code = frame.f_code
    if (event == "call" and not fired and code.co_name == target
            and code.co_filename.endswith("_greenlets.py")):
        fired.append(now())
        os.kill(os.getpid(), signal.SIGINT)
if target == "has_hub":
    redmutex._core._caller()  # the patching is known: a wait asks only for the hub
def holder():
    with redmutex.Lock(client, "g-int", ttl=30):
        gevent.sleep(3)
h = gevent.spawn(holder)
gevent.sleep(0.1)
# (A re-entrant lock asks for its owner, which asks for the patching first.)
lock = redmutex.Lock(client, "g-int", ttl=30, reentrant=target in ("patched", "current"))
sys.setprofile(hook)
try:
    outcome = lock.acquire(timeout=10)
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
sys.setprofile(None)
at = now()
h.join()
again = lock.acquire(timeout=0)
print(json.dumps({"fired": bool(fired), "outcome": outcome, "after": at - fired[0] if fired else None,
                  "again": again}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("helper", ["patched", "has_hub", "current"])
def test_a_signal_in_a_gevent_check_interrupts_the_call(
    procs: PyProcs, redis_url: str, prefix: str, helper: str
) -> None:
    """Ctrl-C that lands while the core asks gevent about the caller ends the call with
    KeyboardInterrupt, and the object is usable again. Before: the exception was dropped, taken
    for "no gevent" (or "no hub"), so the wait blocked the OS thread, the holder greenlet with
    it, until its 10 s ran out (and the KeyboardInterrupt was lost); in `current`, the lost
    KeyboardInterrupt left the acquire to go on, the OS thread taken for its owner."""
    code, out, err = procs.run(PRELUDE + INTERRUPTED_HELPER, redis_url, prefix, helper, timeout=90)
    assert code == 0, err
    result = json.loads(out)
    assert result["fired"] is True, result
    assert result["outcome"] == "KeyboardInterrupt", result
    assert result["after"] < 2.0, result
    assert result["again"] is True, result


# The redis-py shim imported before the patching (gunicorn's `--preload`), one Lock object shared
# by greenlets, as redis-py's own Lock is (`thread_local=True`: the token is the acquiring
# thread's; under the patching, greenlet's).
SHIM_PATCHED_LATER = """
import json, sys
import redis
from redmutex.compat.redis_py import Lock
from gevent import monkey
monkey.patch_all()
import gevent
r = redis.Redis.from_url(sys.argv[1])
lock = Lock(r, sys.argv[2] + "g-shim", timeout=30)
seen = {}
def holder():
    seen["acquired"] = lock.acquire(blocking_timeout=5)
    gevent.sleep(0.3)
    seen["owned_at_end"] = lock.owned()
    lock.release()
def other():
    gevent.sleep(0.1)
    seen["other_owned"] = lock.owned()
    seen["other_token"] = lock.local.token and lock.local.token.decode()
gevent.joinall([gevent.spawn(holder), gevent.spawn(other)], raise_error=True)
print(json.dumps(seen))
"""


@pytest.mark.timeout(120)
def test_the_redis_py_shim_imported_before_the_patching_keeps_tokens_per_greenlet(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    """Before: the token lived in a `threading.local` subclass made at import, per OS thread,
    so another greenlet saw the holder's token: its `owned()` was True and its `release()`
    released the holder's lock (the holder's own release then raised LockError)."""
    code, out, err = procs.run(SHIM_PATCHED_LATER, redis_url, prefix, timeout=90)
    assert code == 0, err
    assert json.loads(out) == {
        "acquired": True,
        "other_owned": False,
        "other_token": None,
        "owned_at_end": True,
    }


# Many greenlets waiting at once under a low limit of open files: the waits of a thread share
# one socket (before, each wait opened a socket pair, two descriptors per waiting greenlet).
MANY_WAITERS = """
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
inside, overlaps, done, errors = 0, 0, 0, []
holder = redmutex.Lock(client, "g-many", ttl=30)
holder.acquire()
def worker():
    global inside, overlaps, done
    try:
        with redmutex.Lock(client, "g-many", ttl=30, timeout=60):
            inside += 1
            overlaps += inside > 1
            inside -= 1
            done += 1
    except Exception as exc:
        errors.append(repr(exc))
workers = [gevent.spawn(worker) for _ in range(300)]
gevent.sleep(0.5)  # every worker waits now
fds_waiting = len(os.listdir("/proc/self/fd"))
holder.release()
gevent.joinall(workers, raise_error=True)
print(json.dumps({"done": done, "overlaps": overlaps, "errors": errors[:3],
                  "fds_waiting": fds_waiting}))
"""


@pytest.mark.timeout(120)
def test_three_hundred_waiting_greenlets_fit_in_256_file_descriptors(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    result = run(procs, MANY_WAITERS, redis_url, prefix)
    assert result["errors"] == [] and result["done"] == 300, result
    assert result["overlaps"] == 0, result
    assert result["fds_waiting"] < 64, result


# `patch_all(thread=False)`: threads stay native, but the greenlets of the main thread still
# take turns on it, so a wait must still let the others run (before: the waiter blocked the
# thread, the holder could not release, and the waiter timed out).
UNPATCHED_THREADS = """
from gevent import monkey
monkey.patch_all(thread=False)
import json, sys, time
import gevent, redmutex
client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])
seen = {}
def holder():
    with redmutex.Lock(client, "g-native", ttl=30):
        gevent.sleep(0.3)
        seen["released"] = time.monotonic()
def waiter():
    gevent.sleep(0.05)
    lock = redmutex.Lock(client, "g-native", ttl=30)
    seen["acquired"] = lock.acquire(timeout=10)
    seen["at"] = time.monotonic()
    lock.release()
gevent.joinall([gevent.spawn(holder), gevent.spawn(waiter)], raise_error=True)
print(json.dumps({"acquired": seen["acquired"], "gap": seen["at"] - seen["released"]}))
"""


@pytest.mark.timeout(120)
def test_greenlets_take_turns_with_threads_left_unpatched(
    procs: PyProcs, redis_url: str, prefix: str
) -> None:
    code, out, err = procs.run(UNPATCHED_THREADS, redis_url, prefix, timeout=90)
    assert code == 0, err
    result = json.loads(out)
    assert result["acquired"] is True and 0 <= result["gap"] < 2.0, result
