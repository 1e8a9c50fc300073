"""Issue 3, `auto_renew=True`: the lease is extended in the background (every ttl/3, from a Rust
task, so a Python thread hogging the GIL cannot starve it) until release; it stops in a forked
child; a loss is reported through `lost`, `on_lost(lock)` (once, from a background thread) and
`LockLostError` when leaving the `with`; a lost lock is never re-created.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
import redmutex.aio
from _helpers import command_calls as _calls
from _helpers import wait_until as _wait_until
from redmutex._server import RedisServer

if TYPE_CHECKING:
    from conftest import MpProcs
    from typing_extensions import Self

KeyOf = Callable[[str, str], bytes]


class _LostLog:
    """An on_lost callback that records every call: its argument and the calling thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, int, bool]] = []
        self.called = threading.Event()

    def __call__(self, lock: object) -> None:
        self.calls.append((lock, threading.get_ident(), threading.current_thread().daemon))
        self.called.set()


class _GilHog:
    """A Python thread in a tight pure-Python loop (no sleeps, no I/O): it holds the GIL for
    whole switch intervals. With `switch_interval`, the interpreter hands the GIL over only that
    rarely, so anything that needs the GIL to renew would miss a 0.5 s lease."""

    def __init__(self, switch_interval: float | None) -> None:
        self.stop = False
        self.spins = 0
        self.switch_interval = switch_interval
        self.old_interval = sys.getswitchinterval()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        n = 0
        while not self.stop:
            n += 1
        self.spins = n

    def __enter__(self) -> Self:
        if self.switch_interval is not None:
            sys.setswitchinterval(self.switch_interval)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        sys.setswitchinterval(self.old_interval)
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def quiet_server(
    make_server: Callable[..., RedisServer],
) -> Iterator[tuple[redmutex.Client, redis.Redis]]:
    """A client (prefix "q:") and a plain connection on a redis-server of this test alone, so
    its commandstats count nobody else's commands."""
    server = make_server()
    conn = redis.Redis(host="127.0.0.1", port=server.port)
    client = redmutex.Client(server.url, prefix="q:")
    try:
        yield client, conn
    finally:
        client.close()
        conn.close()


# --------------------------------------------------------------------------- never lost


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "hog",
    [None, "gil-hog", "gil-hog-0.5s-switch"],
    ids=["idle", "gil-hog", "gil-hog-0.5s-switch"],
)
def test_short_lease_held_long_is_never_lost(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, hog: str | None
) -> None:
    # Renewal every ttl/3 rides out a starved machine's pauses of up to 2/3 ttl (1 s here).
    ttl, hold = 1.5, 6.0
    on_lost = _LostLog()
    lock = redmutex.Lock(client, f"keep-{hog}", ttl=ttl, auto_renew=True, on_lost=on_lost)
    key = key_of(f"keep-{hog}", "lock")
    assert lock.acquire(timeout=5)
    token = (lock.token or "").encode()
    switch = 0.5 if hog == "gil-hog-0.5s-switch" else None
    if hog is None:
        samples = 0
        end = time.monotonic() + hold
        while time.monotonic() < end:
            # the key is ours all along, and its expiry keeps being pushed out
            assert r.get(key) == token
            assert lock.lost is False
            samples += 1
            time.sleep(0.1)
        assert samples >= 10
    else:
        with _GilHog(switch):
            time.sleep(hold)
    assert lock.lost is False
    assert not on_lost.calls
    assert lock.owned() is True
    assert r.get(key) == token
    assert 0 < r.pttl(key) <= ttl * 1000
    remaining = lock.remaining()
    assert remaining is not None and remaining > 0
    lock.release()
    assert r.exists(key) == 0


@pytest.mark.timeout(60)
def test_renews_about_every_third_of_ttl(
    quiet_server: tuple[redmutex.Client, redis.Redis],
) -> None:
    c, conn = quiet_server
    lock = redmutex.Lock(c, "rate", ttl=0.6, auto_renew=True)
    assert lock.acquire(timeout=5)
    before = _calls(conn).get("pexpire", 0)
    time.sleep(3.0)
    renewals = _calls(conn).get("pexpire", 0) - before
    lock.release()
    print(f"\n{renewals} renewals of a 0.6 s lease in 3 s")
    # every ttl/3 = 0.2 s gives ~15; fewer than 5 could not have kept it, 45+ is hammering
    assert 7 <= renewals <= 45, renewals


@pytest.mark.timeout(60)
def test_with_auto_renew_outlives_ttl(client: redmutex.Client) -> None:
    with redmutex.Lock(client, "with-keep", ttl=0.3, auto_renew=True) as lock:
        time.sleep(1.5)
        assert lock.owned() is True
    assert lock.lost is False
    assert lock.locked() is False


@pytest.mark.timeout(60)
def test_renewal_never_shortens_an_extended_lease(
    quiet_server: tuple[redmutex.Client, redis.Redis],
) -> None:
    # extend(ttl): "the lease now ends ttl from now". Renewal keeps the lease at least the
    # lock's ttl; it must not cut a longer extend back to the ttl, nor let a shorter one run out
    # before its next turn.
    c, conn = quiet_server
    longer = redmutex.Lock(c, "longer", ttl=0.6, auto_renew=True)
    assert longer.acquire(timeout=5)
    longer.extend(30)
    time.sleep(1.5)  # several renewal periods of the 0.6 s ttl
    assert conn.pttl("q:{longer}:lock") > 25_000
    remaining = longer.remaining()
    assert remaining is not None and remaining > 25
    longer.release()
    shorter = redmutex.Lock(c, "shorter", ttl=6, auto_renew=True)
    assert shorter.acquire(timeout=5)
    shorter.extend(0.4)  # the next renewal would come at ttl/3 = 2 s
    time.sleep(1.5)
    assert not shorter.lost and shorter.owned()
    assert 0 < conn.pttl("q:{shorter}:lock") <= 6_000
    shorter.release()


class _ExtendTally:
    """What the racing extends below found right after each returned: how many were looked at,
    and those whose lease (in Redis, or as the object counts it) fell short of the 5 s asked."""

    def __init__(self) -> None:
        self.done = 0
        self.short: list[tuple[int, int, float | None]] = []

    def look(self, r: redis.Redis, key: bytes, lock: redmutex.Lock | redmutex.aio.Lock) -> None:
        pttl = int(r.pttl(key))
        remaining = lock.remaining()
        if lock.lost:
            return  # renewal came too late for the 20 ms lease (a loaded machine)
        if pttl < 4000 or remaining is None or remaining < 4:
            self.short.append((self.done, pttl, remaining))
        self.done += 1

    def check(self) -> None:
        assert self.done >= 300, self.done
        assert self.short == [], f"{len(self.short)} of {self.done}: {self.short[:5]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reentrant", [False, True], ids=["lock", "reentrant"])
def test_an_extend_racing_a_renewal_is_the_lease_in_redis_when_it_returns(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, reentrant: bool
) -> None:
    # A renewal extend already on its way when the caller's extend(5) goes out may run after it
    # in Redis and put the lease back to the ttl; renewal then asked for no more than that, so
    # the caller's 5 s were gone for good. Here the lease is first cut short (renewal then comes
    # every ~10 ms, at half of what is left) and extend(5) is sent at a random moment of that
    # cadence, many times: every time, when extend() returns, Redis and remaining() say 5 s.
    rng = random.Random(1)
    lock = redmutex.Lock(client, "racing", ttl=0.3, auto_renew=True, reentrant=reentrant)
    key = key_of("racing", "lock")
    tally = _ExtendTally()
    deadline = time.monotonic() + 40
    while tally.done < 1000 and time.monotonic() < deadline:
        if lock.token is None or lock.lost:  # a loaded machine may let a 20 ms lease lapse
            if lock.token is not None:
                with contextlib.suppress(redmutex.LockError):
                    lock.release()
            assert lock.acquire(timeout=5)
        try:
            lock.extend(0.02)
            time.sleep(rng.random() * 0.01)
            lock.extend(5)
        except redmutex.LockError:
            continue  # lapsed before the extend: not the race looked for
        tally.look(r, key, lock)
    lock.release()
    tally.check()


@pytest.mark.timeout(120)
def test_an_asyncio_extend_racing_a_renewal_is_the_lease_in_redis_when_it_returns(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    # The same race through redmutex.aio (its extend runs on the loop's own connection, whose
    # task cannot block: it looks again every ms until renewal put the lease back).

    async def race() -> _ExtendTally:
        rng = random.Random(2)
        lock = redmutex.aio.Lock(client, "racing-aio", ttl=0.3, auto_renew=True)
        key = key_of("racing-aio", "lock")
        tally = _ExtendTally()
        deadline = time.monotonic() + 40
        while tally.done < 1000 and time.monotonic() < deadline:
            if lock.token is None or lock.lost:
                if lock.token is not None:
                    with contextlib.suppress(redmutex.LockError):
                        await lock.release()
                assert await lock.acquire(timeout=5)
            try:
                await lock.extend(0.02)
                await asyncio.sleep(rng.random() * 0.01)
                await lock.extend(5)
            except redmutex.LockError:
                continue
            tally.look(r, key, lock)
        await lock.release()
        return tally

    asyncio.run(race()).check()


# ----------------------------------------------------------------------------- loss


@pytest.mark.timeout(60)
def test_deleted_key_is_reported_once(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    on_lost = _LostLog()
    lock = redmutex.Lock(client, "del", ttl=0.5, auto_renew=True, on_lost=on_lost)
    key = key_of("del", "lock")
    with pytest.raises(redmutex.LockLostError, match="lock was lost"), lock:
        assert lock.lost is False
        assert r.delete(key) == 1
        assert on_lost.called.wait(5.0), "on_lost was not called"
        assert lock.lost is True
        time.sleep(1.5)  # several more renewal periods: still once, and nothing re-created
        assert r.exists(key) == 0
    assert len(on_lost.calls) == 1, on_lost.calls
    target, ident, _ = on_lost.calls[0]
    assert target is lock
    assert ident != threading.main_thread().ident
    assert lock.lost is True
    assert lock.token is None
    assert r.exists(key) == 0


@pytest.mark.timeout(60)
def test_taken_over_key_is_reported_and_left_alone(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """Somebody else owns the key now: loss reported; their key neither extended nor deleted."""
    on_lost = _LostLog()
    lock = redmutex.Lock(client, "theirs", ttl=0.6, auto_renew=True, on_lost=on_lost)
    key = key_of("theirs", "lock")
    assert lock.acquire(timeout=5)
    foreign = b"f" * 32
    r.set(key, foreign, px=4000)
    set_at = time.monotonic()
    assert on_lost.called.wait(5.0), "on_lost was not called"
    time.sleep(1.0)
    assert len(on_lost.calls) == 1
    assert on_lost.calls[0][0] is lock
    assert lock.lost is True
    assert lock.owned() is False
    assert r.get(key) == foreign
    # never extended by our renewal: what is left is what the foreign owner set, minus time
    assert r.pttl(key) <= 4000 - (time.monotonic() - set_at) * 1000 + 50
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    assert r.get(key) == foreign


@pytest.mark.timeout(60)
def test_the_loss_warning_says_what_renewal_found(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answered the extend "not ours": the WARNING says the lock may have been taken by
    another owner, not that the lease ended before renewal (which it said before, 1 of 1)."""
    on_lost = _LostLog()
    lock = redmutex.Lock(client, "told", ttl=0.6, auto_renew=True, on_lost=on_lost)
    assert lock.acquire(timeout=5)
    r.set(key_of("told", "lock"), b"f" * 32, px=4000)
    with caplog.at_level("WARNING", logger="redmutex"):
        assert on_lost.called.wait(5.0), "on_lost was not called"
    lost = [rec.getMessage() for rec in caplog.records if "was lost" in rec.getMessage()]
    assert len(lost) == 1, caplog.text
    assert "another owner had taken it" in lost[0], lost[0]
    assert "before renewal" not in lost[0], lost[0]
    with pytest.raises(redmutex.LockLostError):
        lock.release()


@pytest.mark.timeout(60)
def test_loss_without_callback(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "nocb", ttl=0.4, auto_renew=True)
    with pytest.raises(redmutex.LockLostError), lock:
        r.delete(key_of("nocb", "lock"))
        _wait_until(lambda: lock.lost, 5.0, "the loss to be noticed")
    assert lock.lost is True


@pytest.mark.timeout(60)
def test_on_lost_that_raises_does_not_break_anything(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    called = threading.Event()

    def bad(lock: object) -> None:
        called.set()
        raise RuntimeError("callback failure")

    lock = redmutex.Lock(client, "badcb", ttl=0.4, auto_renew=True, on_lost=bad)
    assert lock.acquire(timeout=5)
    r.delete(key_of("badcb", "lock"))
    assert called.wait(5.0)
    assert lock.lost is True
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    # the object is usable again
    assert lock.acquire(timeout=5)
    assert lock.lost is False
    time.sleep(1.0)
    assert lock.owned() is True
    lock.release()


# --------------------------------------------------------------------- renewal stops


@pytest.mark.timeout(60)
def test_renewal_stops_after_release(quiet_server: tuple[redmutex.Client, redis.Redis]) -> None:
    c, conn = quiet_server
    lock = redmutex.Lock(c, "stop", ttl=0.3, auto_renew=True)
    assert lock.acquire(timeout=5)
    time.sleep(1.0)
    assert _calls(conn).get("pexpire", 0) >= 3  # it did renew
    lock.release()
    after_release = _calls(conn).get("pexpire", 0)
    time.sleep(1.5)
    assert _calls(conn).get("pexpire", 0) == after_release
    assert conn.exists(b"q:{stop}:lock") == 0
    assert lock.lost is False


@pytest.mark.timeout(60)
def test_renewal_stops_after_release_and_reacquire_by_other(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """After release, another owner's key is never touched by the old renewal."""
    lock = redmutex.Lock(client, "re", ttl=0.3, auto_renew=True)
    assert lock.acquire(timeout=5)
    time.sleep(0.5)
    lock.release()
    other = redmutex.Lock(client, "re", ttl=1.0)
    assert other.acquire(timeout=5)
    time.sleep(1.3)  # past the other's own lease: nobody renewed it
    assert r.exists(key_of("re", "lock")) == 0
    assert lock.lost is False


def _child_of_renewing_parent(
    url: str, prefix: str, name: str, lock: redmutex.Lock, out: Connection
) -> None:
    """Forked from a process that holds `lock` with auto_renew."""
    report: dict[str, object] = {"token": lock.token, "lost": lock.lost}
    report["owned"] = lock.owned()
    report["locked"] = lock.locked()
    try:
        lock.release()
        report["release"] = "returned"
    except redmutex.LockNotOwnedError:
        report["release"] = "LockNotOwnedError"
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        report["release"] = f"{type(exc).__name__}: {exc}"
    out.send(report)
    time.sleep(1.5)  # outlive a few renewal periods of the parent


@pytest.mark.timeout(90)
def test_forked_child_holds_nothing_parent_keeps_renewing(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    key_of: KeyOf,
    mp_procs: MpProcs,
) -> None:
    lock = redmutex.Lock(client, "forkp", ttl=0.5, auto_renew=True)
    assert lock.acquire(timeout=5)
    token = lock.token
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    child = mp_procs.start(_child_of_renewing_parent, redis_url, prefix, "forkp", lock, send)
    assert recv.poll(30), "the child did not report"
    report = recv.recv()
    child.join(30)
    assert child.exitcode == 0
    assert report == {
        "token": None,
        "lost": False,
        "owned": False,
        "locked": True,
        "release": "LockNotOwnedError",
    }
    # the parent's renewal survived the fork
    assert lock.token == token
    assert lock.lost is False
    assert lock.owned() is True
    assert r.get(key_of("forkp", "lock")) == (token or "").encode()
    lock.release()


def _child_renewing_its_own(url: str, prefix: str, name: str, out: Connection) -> None:
    """Forked from a process whose renewals ran: takes a lock of its own, with auto_renew, and
    reports whether renewal kept it past several of its leases."""
    c = redmutex.Client(url, prefix=prefix)
    lock = redmutex.Lock(c, name, ttl=0.5, auto_renew=True)
    assert lock.acquire(timeout=10)
    time.sleep(1.5)  # three leases: only renewal, run from this process, keeps it
    out.send({"owned": lock.owned(), "lost": lock.lost})
    lock.release()


@pytest.mark.timeout(90)
def test_a_forked_child_renews_its_own_holds(
    client: redmutex.Client, redis_url: str, prefix: str, mp_procs: MpProcs
) -> None:
    """Renewal tasks are spawned late by a starter task of the process: a child forked after
    the parent's starter ran needs one of its own (the parent's does not run there)."""
    lock = redmutex.Lock(client, "fork-own-parent", ttl=0.5, auto_renew=True)
    assert lock.acquire(timeout=5)
    time.sleep(0.5)  # the parent's starter has spawned its renewal
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    child = mp_procs.start(_child_renewing_its_own, redis_url, prefix, "fork-own-child", send)
    assert recv.poll(30), "the child did not report"
    assert recv.recv() == {"owned": True, "lost": False}
    child.join(30)
    assert child.exitcode == 0
    assert lock.owned() is True
    lock.release()


def _renewing_holder_that_forks(
    url: str, prefix: str, name: str, ttl: float, out: Connection
) -> None:
    c = redmutex.Client(url, prefix=prefix)
    lock = redmutex.Lock(c, name, ttl=ttl, auto_renew=True)
    assert lock.acquire(timeout=10)
    token = lock.token
    pid = os.fork()
    if pid == 0:  # the grandchild: holds nothing; uses the library, so its runtime is rebuilt
        code = 0
        try:
            out.send(("child", os.getpid(), lock.token, lock.owned()))
            time.sleep(60)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    out.send(("holder", pid, token, True))
    time.sleep(120)


@pytest.mark.timeout(90)
def test_renewal_does_not_run_in_forked_child(
    redis_url: str, prefix: str, r: redis.Redis, key_of: KeyOf, mp_procs: MpProcs
) -> None:
    """A renewing holder forks, then dies (SIGKILL): the lock ends with its lease although the
    forked copy of the holder lives on (it must not renew the parent's hold)."""
    ttl = 0.6
    key = key_of("forkc", "lock")
    recv, send = mp_procs.ctx("fork").Pipe(duplex=False)
    holder = mp_procs.start(_renewing_holder_that_forks, redis_url, prefix, "forkc", ttl, send)
    reports: dict[str, tuple[int, str | None, bool]] = {}
    grandchild = 0
    try:
        for _ in range(2):
            assert recv.poll(30), f"got only {reports}"
            who, pid, token, owned = recv.recv()
            reports[who] = (pid, token, owned)
            grandchild = pid  # both report the forked copy's pid: ours to kill at the end
        assert reports["child"][0] == grandchild
        holder_token = reports["holder"][1]
        assert holder_token
        assert reports["child"][1:] == (None, False)  # the fork holds none of the parent's locks
        time.sleep(1.0)  # the holder's renewal keeps the 0.6 s lease alive meanwhile
        assert r.get(key) == holder_token.encode()
        mp_procs.kill(holder)
        killed_at = time.monotonic()
        os.kill(grandchild, 0)  # the forked copy is still alive
        _wait_until(lambda: r.exists(key) == 0, ttl + 2.0, "the dead holder's lease to end")
        print(f"\nlease ended {time.monotonic() - killed_at:.3f} s after the holder died")
        os.kill(grandchild, 0)
        time.sleep(2 * ttl)
        assert r.exists(key) == 0  # and nothing re-created it
    finally:
        if grandchild:
            try:
                os.kill(grandchild, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(60)
def test_renewal_reports_loss_while_server_unreachable(
    make_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Renewal never dies silently: with the server paused (SIGSTOP) past the lease, the hold is
    reported lost from the local deadline (no answer from Redis needed), once; after the server
    returns, the lock is not re-created and leaving the `with` raises LockLostError."""
    server = make_server()
    assert server.process is not None
    pid = server.process.pid
    conn = redis.Redis(host="127.0.0.1", port=server.port)
    # A renewal call in flight ends by these timeouts; the loss must be reported by then.
    connect_timeout, command_timeout, ttl = 1.0, 0.3, 0.6
    c = redmutex.Client(
        server.url,
        prefix="ru:",
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
    )
    on_lost = _LostLog()
    lock = redmutex.Lock(c, "down", ttl=ttl, auto_renew=True, on_lost=on_lost)
    try:
        with pytest.raises(redmutex.LockLostError), lock:
            os.kill(pid, signal.SIGSTOP)
            try:
                stopped_at = time.monotonic()
                bound = ttl + connect_timeout + command_timeout + 2.0
                assert on_lost.called.wait(bound), "loss not reported"
                print(f"\nloss reported {time.monotonic() - stopped_at:.3f} s after the pause")
                assert lock.lost is True
            finally:
                os.kill(pid, signal.SIGCONT)
            time.sleep(1.0)
            assert conn.exists(b"ru:{down}:lock") == 0
        assert len(on_lost.calls) == 1
        assert on_lost.calls[0][0] is lock
        # No answer came: the warning says so.
        assert "its lease ended before renewal got an answer" in caplog.text
    finally:
        c.close()
        conn.close()
