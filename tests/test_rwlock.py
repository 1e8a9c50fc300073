"""The Read-write lock section of the contract, against a real redis-server."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
import redmutex
from _helpers import ResultThread as Worker

# ---------------------------------------------------------------------------------- fixtures
# redis_url, prefix, client, r, other_client and children come from conftest.py.


def _python(
    children: list[subprocess.Popen[str]], script: str, *args: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    children.append(proc)
    return proc


# ---------------------------------------------------------------------------------- helpers

TOKEN_RE = re.compile(r"[0-9a-f]{32}")


def rw_key(prefix: str, name: str, suffix: str) -> bytes:
    return f"{prefix}{{{name}}}:rw:{suffix}".encode()


def prefix_keys(r: redis.Redis, prefix: str) -> set[bytes]:
    return set(r.scan_iter(match=prefix.encode() + b"*", count=1000))


@pytest.fixture
def rw(client: redmutex.Client) -> redmutex.RWLock:
    return redmutex.RWLock(client, "rw", ttl=10)


@pytest.fixture
def other_rw(other_client: redmutex.Client) -> redmutex.RWLock:
    """The same read-write lock through another client (another "process" as far as it goes)."""
    return redmutex.RWLock(other_client, "rw", ttl=10)


# ---------------------------------------------------------------------------------- basics


@pytest.mark.timeout(30)
def test_read_and_write_objects(rw: redmutex.RWLock, r: redis.Redis, prefix: str) -> None:
    reader, writer = rw.read(), rw.write()
    assert reader is not rw.read()  # a new object each call
    assert reader.mode == "read" and writer.mode == "write"
    assert reader.rwlock is rw and reader.name == "rw" and reader.ttl == 10.0
    for side in (reader, writer):
        assert side.token is None and side.remaining() is None and side.lost is False
        assert side.owned() is False and side.locked() is False
        assert side.acquire() is True
        assert side.token is not None and TOKEN_RE.fullmatch(side.token)
        remaining = side.remaining()
        assert remaining is not None and 9 < remaining <= 10
        assert side.owned() is True and side.locked() is True and rw.locked() is True
        assert all(k.startswith(f"{prefix}{{rw}}:rw:".encode()) for k in prefix_keys(r, prefix))
        side.release()
        assert side.token is None and side.owned() is False and rw.locked() is False
        assert prefix_keys(r, prefix) == set()


@pytest.mark.timeout(30)
def test_readers_key_lives_as_long_as_its_longest_lease(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """The readers' key expires with its longest lease (a dead reader leaves nothing behind, a
    live one is never cut short), and a reader that joins drops leases that ended."""
    readers = rw_key(prefix, "long", "readers")

    def reader(ttl: float) -> redmutex.Lock:
        side = redmutex.RWLock(client, "long", ttl=ttl).read()
        assert side.acquire(blocking=False) is True
        return side

    short = reader(0.2)
    assert 0 < r.pttl(readers) <= 200
    middle = reader(10)
    assert 9_000 < r.pttl(readers) <= 10_000
    longest = reader(30)
    assert 29_000 < r.pttl(readers) <= 30_000
    time.sleep(0.3)  # the short lease ends; its entry stays until a reader joins
    assert r.zcard(readers) == 3
    again = reader(5)  # joins: drops the ended lease, keeps the longest expiry
    assert r.zcard(readers) == 3
    assert r.zscore(readers, short.token or "") is None
    assert 29_000 < r.pttl(readers) <= 30_000
    for side in (middle, longest, again):
        side.release()
    assert not r.exists(readers)


@pytest.mark.timeout(30)
def test_readers_overlap(rw: redmutex.RWLock, other_rw: redmutex.RWLock) -> None:
    readers = [rw.read(), other_rw.read(), rw.read(), other_rw.read()]
    assert all(x.acquire(blocking=False) for x in readers)
    assert rw.readers() == 4
    # from another thread: in this one, taking the write lock would be an upgrade
    writer = other_rw.write()
    th = Worker(lambda: writer.acquire(blocking=False))
    th.start()
    assert th.outcome(10) is False
    for x in readers:
        x.release()
    assert rw.readers() == 0


@pytest.mark.timeout(30)
def test_writer_excludes_all(rw: redmutex.RWLock, other_rw: redmutex.RWLock) -> None:
    writer = rw.write()
    assert writer.acquire()
    assert other_rw.read().acquire(blocking=False) is False
    assert other_rw.read().acquire(timeout=0.2) is False
    assert other_rw.write().acquire(blocking=False) is False
    assert rw.readers() == 0
    writer.release()
    reader = other_rw.read()
    assert reader.acquire(blocking=False) is True
    reader.release()


@pytest.mark.timeout(30)
def test_object_is_not_reentrant_and_not_owned(rw: redmutex.RWLock) -> None:
    for side in (rw.read(), rw.write()):
        with pytest.raises(redmutex.LockNotOwnedError):
            side.release()
        with pytest.raises(redmutex.LockNotOwnedError):
            side.extend()
        assert side.acquire()
        with pytest.raises(redmutex.LockError):
            side.acquire()
        side.release()


@pytest.mark.timeout(30)
def test_extend_and_loss(rw: redmutex.RWLock, client: redmutex.Client) -> None:
    short = redmutex.RWLock(client, "short", ttl=0.3)
    for side in (short.read(), short.write()):
        assert side.acquire()
        side.extend(5)
        time.sleep(0.5)
        assert side.owned()
        remaining = side.remaining()
        assert remaining is not None and 4 < remaining < 5
        side.extend(0.1)
        time.sleep(0.3)
        assert side.owned() is False
        with pytest.raises(redmutex.LockLostError):
            side.extend()
        assert side.lost is True
        with pytest.raises(redmutex.LockLostError, match="lock was lost"):
            side.release()
        assert side.token is None and side.lost is True


@pytest.mark.timeout(30)
def test_lost_when_removed_externally(rw: redmutex.RWLock, r: redis.Redis, prefix: str) -> None:
    reader = rw.read()
    assert reader.acquire()
    r.delete(rw_key(prefix, "rw", "readers"))
    with pytest.raises(redmutex.LockLostError):
        reader.release()
    writer = rw.write()
    assert writer.acquire()
    r.set(rw_key(prefix, "rw", "writer"), b"someone else")
    with pytest.raises(redmutex.LockLostError):
        writer.release()
    assert r.get(rw_key(prefix, "rw", "writer")) == b"someone else"  # never deleted
    r.delete(rw_key(prefix, "rw", "writer"))


# ---------------------------------------------------------------------------------- with


@pytest.mark.timeout(30)
def test_with_binds_and_releases(rw: redmutex.RWLock, r: redis.Redis, prefix: str) -> None:
    with rw.read() as a, rw.read() as b:
        assert a.owned() and b.owned() and rw.readers() == 2
    assert rw.readers() == 0
    with rw.write() as w:
        assert w.mode == "write" and w.owned()
    assert not rw.locked()
    assert prefix_keys(r, prefix) == set()


@pytest.mark.timeout(30)
def test_with_timeout_raises(client: redmutex.Client, other_rw: redmutex.RWLock) -> None:
    writer = other_rw.write()
    assert writer.acquire()
    waiting = redmutex.RWLock(client, "rw", timeout=0.3)
    for side in (waiting.read(), waiting.write()):
        t0 = time.monotonic()
        with pytest.raises(redmutex.LockTimeoutError), side:
            pytest.fail("the block must not run")
        assert 0.25 <= time.monotonic() - t0 < 3
    writer.release()


@pytest.mark.timeout(30)
def test_with_lost_lease(client: redmutex.Client, caplog: pytest.LogCaptureFixture) -> None:
    short = redmutex.RWLock(client, "wl", ttl=0.2)
    with pytest.raises(redmutex.LockLostError, match="lock was lost"), short.write():
        time.sleep(0.5)
    with (
        caplog.at_level(logging.WARNING, logger="redmutex"),
        pytest.raises(KeyError),
        short.read(),
    ):
        time.sleep(0.5)
        raise KeyError("from the block")
    assert any(rec.name == "redmutex" for rec in caplog.records)


def test_bad_arguments(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="name"):
        redmutex.RWLock(client, "")
    with pytest.raises(TypeError, match="name"):
        redmutex.RWLock(client, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        redmutex.RWLock(client, "x", ttl=0)
    with pytest.raises(ValueError, match="timeout"):
        redmutex.RWLock(client, "x", timeout=-1)
    with pytest.raises(TypeError, match="on_lost"):
        redmutex.RWLock(client, "x", on_lost=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        redmutex.RWLock(client, "x").write().extend(-1)


# ------------------------------------------------------------------------- deadlock guard


@pytest.mark.timeout(30)
def test_upgrade_raises_instead_of_deadlocking(rw: redmutex.RWLock) -> None:
    reader = rw.read()
    assert reader.acquire()
    t0 = time.monotonic()
    with pytest.raises(redmutex.LockError, match="upgrade"):
        rw.write().acquire()  # blocking, no timeout: would wait forever
    with pytest.raises(redmutex.LockError, match="upgrade"), rw.write():
        pass
    assert time.monotonic() - t0 < 2
    reader.release()
    writer = rw.write()
    assert writer.acquire()  # fine once the read lock is given back
    # and the other way round: any lock while this thread holds the write lock
    with pytest.raises(redmutex.LockError):
        rw.read().acquire()
    with pytest.raises(redmutex.LockError):
        rw.write().acquire()
    writer.release()


@pytest.mark.timeout(30)
def test_the_guard_holds_across_rwlock_objects_of_the_client(
    client: redmutex.Client, other_rw: redmutex.RWLock
) -> None:
    """A function that makes its own RWLock(client, name) on each call nests like one object: a
    read->write upgrade raises at once (it waited for itself: a timeout, or for ever without
    one), and a nested read gets past a waiting writer (it waited behind that writer, who waits
    for the outer read)."""
    outer = redmutex.RWLock(client, "rw", ttl=10).read()
    assert outer.acquire()
    t0 = time.monotonic()
    with pytest.raises(redmutex.LockError, match="upgrade"):
        redmutex.RWLock(client, "rw", ttl=10).write().acquire(timeout=3)
    assert time.monotonic() - t0 < 2
    writer = other_rw.write()  # another client: another process, as far as it goes
    th = Worker(lambda: writer.acquire(timeout=10))
    th.start()
    time.sleep(0.3)
    assert other_rw.read().acquire(timeout=0.2) is False  # held back by the waiting writer
    nested = redmutex.RWLock(client, "rw", ttl=10).read()
    assert nested.acquire(timeout=2) is True
    nested.release()
    outer.release()
    assert th.outcome(10) is True
    writer.release()
    # and any lock while this thread holds the write lock through another object
    held = redmutex.RWLock(client, "rw", ttl=10).write()
    assert held.acquire()
    t0 = time.monotonic()
    for side in ("read", "write"):
        with pytest.raises(redmutex.LockError, match="holds the write lock"):
            getattr(redmutex.RWLock(client, "rw", ttl=10), side)().acquire(timeout=3)
    assert time.monotonic() - t0 < 2
    held.release()
    # another name of the client is not guarded by this one's holds
    with redmutex.RWLock(client, "rw", ttl=10).read(), redmutex.RWLock(client, "rw-x").write():
        pass


@pytest.mark.timeout(30)
def test_other_threads_wait_instead_of_raising(rw: redmutex.RWLock) -> None:
    reader = rw.read()
    assert reader.acquire()
    writer = rw.write()
    th = Worker(lambda: writer.acquire(timeout=5))
    th.start()
    time.sleep(0.3)
    released_at = time.monotonic()
    reader.release()
    assert th.outcome(10) is True  # another thread of the same RWLock simply waits
    assert th.finished_at is not None and th.finished_at - released_at < 1.0
    writer.release()


@pytest.mark.timeout(30)
def test_reader_reenters_past_a_waiting_writer(
    client: redmutex.Client, rw: redmutex.RWLock, other_rw: redmutex.RWLock
) -> None:
    first = rw.read()
    assert first.acquire()
    writer = other_rw.write()
    th = Worker(lambda: writer.acquire(timeout=10))
    th.start()
    time.sleep(0.3)
    # a new reader elsewhere is held back by the waiting writer...
    assert other_rw.read().acquire(timeout=0.2) is False
    # ...but this thread, which holds a read lock the writer waits for, may read again
    second = rw.read()
    assert second.acquire(timeout=2) is True
    second.release()
    first.release()
    assert th.outcome(10) is True
    writer.release()


# ---------------------------------------------------------------------------------- waiting


@pytest.mark.timeout(30)
def test_readers_wake_promptly_on_write_release(
    rw: redmutex.RWLock, other_rw: redmutex.RWLock
) -> None:
    writer = other_rw.write()
    assert writer.acquire()
    readers = [rw.read() for _ in range(3)]
    threads = [Worker(lambda x=x: x.acquire(timeout=10)) for x in readers]
    for th in threads:
        th.start()
    time.sleep(0.4)
    released_at = time.monotonic()
    writer.release()
    for th in threads:
        assert th.outcome(10) is True
        assert th.finished_at is not None and th.finished_at - released_at < 1.0
    assert rw.readers() == 3
    for x in readers:
        x.release()


@pytest.mark.timeout(30)
def test_writer_wakes_promptly_when_last_reader_leaves(
    rw: redmutex.RWLock, other_rw: redmutex.RWLock
) -> None:
    a, b = rw.read(), rw.read()
    assert a.acquire() and b.acquire()
    writer = other_rw.write()
    th = Worker(lambda: writer.acquire(timeout=20))
    th.start()
    time.sleep(0.3)
    a.release()
    time.sleep(0.3)
    assert th.is_alive()
    released_at = time.monotonic()
    b.release()
    assert th.outcome(10) is True
    assert th.finished_at is not None and th.finished_at - released_at < 1.0
    writer.release()


@pytest.mark.timeout(30)
def test_writer_giving_up_lets_readers_in(
    rw: redmutex.RWLock, other_rw: redmutex.RWLock, r: redis.Redis, prefix: str
) -> None:
    holder = rw.read()
    assert holder.acquire()
    writer = other_rw.write()
    wth = Worker(lambda: writer.acquire(timeout=1.0))
    wth.start()
    time.sleep(0.3)
    assert r.zcard(rw_key(prefix, "rw", "writers_waiting")) == 1
    late = other_rw.read()
    rth = Worker(lambda: late.acquire(timeout=10))
    rth.start()
    assert wth.outcome(10) is False
    assert rth.outcome(10) is True
    assert rth.finished_at is not None and wth.finished_at is not None
    assert rth.finished_at - wth.finished_at < 1.0  # woken at once, not when the mark lapses
    assert r.exists(rw_key(prefix, "rw", "writers_waiting")) == 0
    late.release()
    holder.release()


@pytest.mark.timeout(60)
def test_writer_is_not_starved_by_continuous_readers(redis_url: str, prefix: str) -> None:
    # Four threads, each with its own client, read in overlapping turns of 100 ms without a
    # pause, so there is always a reader. A writer that arrives must still get in soon: its
    # waiting mark holds back new readers until the current ones are done.
    clients = [redmutex.Client(redis_url, prefix=prefix) for _ in range(5)]
    stop = threading.Event()
    reads = [0] * 4

    def read_forever(i: int) -> None:
        lock = redmutex.RWLock(clients[i], "stream", ttl=10)
        time.sleep(0.025 * i)  # staggered, so the turns overlap
        while not stop.is_set():
            with lock.read():
                reads[i] += 1
                time.sleep(0.1)

    readers = [threading.Thread(target=read_forever, args=(i,), daemon=True) for i in range(4)]
    try:
        for th in readers:
            th.start()
        time.sleep(1.0)
        probe = redmutex.RWLock(clients[4], "stream", ttl=10)
        assert probe.readers() >= 1
        writer = probe.write()
        t0 = time.monotonic()
        assert writer.acquire(timeout=20) is True
        waited = time.monotonic() - t0
        assert probe.readers() == 0
        writer.release()
        # bounded by the longest read turn (100 ms) plus hand-off latency, with room for noise
        assert waited < 3.0, waited
        time.sleep(0.5)
        before = sum(reads)
        time.sleep(0.5)
        assert sum(reads) > before  # readers carry on after the writer
    finally:
        stop.set()
        for th in readers:
            th.join(10)
        for c in clients:
            c.close()


# ------------------------------------------------------------------ dead holders, auto_renew

HOLDER_SCRIPT = """
import sys, time, redmutex
url, prefix, name, mode, ttl = sys.argv[1:6]
rw = redmutex.RWLock(redmutex.Client(url, prefix=prefix), name, ttl=float(ttl))
side = rw.read() if mode == "read" else rw.write()
assert side.acquire(timeout=10)
print(repr(time.monotonic()), flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("dead", "waiting"), [("read", "write"), ("write", "read")])
def test_killed_holder_stops_counting_after_ttl(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    children: list[subprocess.Popen[str]],
    dead: str,
    waiting: str,
) -> None:
    ttl = 1.5
    proc = _python(children, HOLDER_SCRIPT, redis_url, prefix, "dead", dead, str(ttl))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    t_held = float(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    rw = redmutex.RWLock(client, "dead", ttl=10)
    side = rw.read() if waiting == "read" else rw.write()
    assert side.acquire(timeout=15) is True
    waited = time.monotonic() - t_held
    assert ttl - 0.05 <= waited < ttl + 1.5
    side.release()


@pytest.mark.timeout(30)
def test_auto_renew_and_on_lost(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    seen: list[object] = []
    called = threading.Event()

    def on_lost(obj: object) -> None:
        seen.append(obj)
        called.set()

    rw = redmutex.RWLock(client, "renew", ttl=1.5, auto_renew=True, on_lost=on_lost)
    assert rw.auto_renew is True
    for side in (rw.read(), rw.write()):
        with side:
            time.sleep(4.6)  # more than three leases
            assert side.owned()
        assert side.lost is False
    reader = rw.read()
    assert reader.acquire()
    r.delete(rw_key(prefix, "renew", "readers"))
    assert called.wait(5)
    assert seen == [reader] and reader.lost is True
    with pytest.raises(redmutex.LockLostError):
        reader.release()


def test_a_write_right_after_a_renewed_read_is_no_upgrade(client: redmutex.Client) -> None:
    # A renewal task that kept the read hold's thread mark alive until it ended made the same
    # thread's next write acquire look like a read->write upgrade (35 of 200 before).
    refused = 0
    for i in range(200):
        rw = redmutex.RWLock(client, f"read-then-write-{i}", ttl=5, auto_renew=True)
        with rw.read():
            pass
        try:
            with rw.write():
                pass
        except redmutex.LockError:
            refused += 1
    assert refused == 0, f"{refused} of 200 writes refused as an upgrade"
