"""Issue 3, `replicas=k`: an acquire counts only once k replicas acknowledged the lock write
(Redis WAIT, at most `command_timeout`); otherwise the lock is given back (no key left) and the
attempt fails like a timeout, also with fewer than k replicas in existence.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import wait_until as _wait_until
from redmutex._server import RedisServer

COMMAND_TIMEOUT = 1.0
# What "within the command timeout" may take on a loaded 2-core machine.
MARGIN = 2.0


@dataclass
class Pair:
    primary: RedisServer
    replicas: list[RedisServer]
    conn: redis.Redis  # to the primary
    prefix: str

    def key(self, name: str, suffix: str = "lock") -> bytes:
        return (self.prefix + "{" + name + "}:" + suffix).encode()

    def client(self) -> redmutex.Client:
        return redmutex.Client(
            self.primary.url, prefix=self.prefix, command_timeout=COMMAND_TIMEOUT
        )


def _online_replicas(conn: redis.Redis) -> int:
    info = conn.info("replication")
    n = 0
    for i in range(int(info.get("connected_slaves", 0))):
        entry = info.get(f"slave{i}")
        if isinstance(entry, dict) and entry.get("state") == "online":
            n += 1
    return n


def _wait_online(conn: redis.Redis, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _online_replicas(conn) < n:
        assert time.monotonic() < deadline, conn.info("replication")
        time.sleep(0.05)


@pytest.fixture
def replicated(make_server: Callable[..., RedisServer], prefix: str) -> Iterator[Pair]:
    """A primary with one real replica (`--replicaof`), both on loopback, both ours."""
    primary = make_server()
    replica = make_server(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    conn = redis.Redis(host="127.0.0.1", port=primary.port)
    try:
        _wait_online(conn, 1)
        yield Pair(primary, [replica], conn, prefix)
    finally:
        conn.close()


class _Paused:
    """SIGSTOP a server process of ours; SIGCONT on leaving, whatever happened."""

    def __init__(self, server: RedisServer) -> None:
        assert server.process is not None
        self.pid = server.process.pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _outcome(fn: Callable[[], bool]) -> object:
    """fn()'s result, or the exception it raised (to compare in an assertion)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - inspected by the test
        return exc


def _assert_no_lock_left(pair: Pair, name: str) -> None:
    assert pair.conn.exists(pair.key(name)) == 0
    head = (pair.prefix + "{" + name + "}").encode()
    left = set(pair.conn.scan_iter(match=head + b"*", count=1000))
    assert left <= {pair.key(name, "fence")}, left


# ------------------------------------------------------------------------------ success


@pytest.mark.timeout(60)
def test_replica_acknowledges(replicated: Pair) -> None:
    c = replicated.client()
    replica_conn = redis.Redis(host="127.0.0.1", port=replicated.replicas[0].port)
    try:
        lock = redmutex.Lock(c, "ack", ttl=30, replicas=1)
        t0 = time.monotonic()
        assert lock.acquire(timeout=5) is True
        assert time.monotonic() - t0 < COMMAND_TIMEOUT + MARGIN
        assert lock.token is not None
        # acknowledged means the replica has the write already, no waiting for it here
        assert replica_conn.get(replicated.key("ack")) == lock.token.encode()
        assert lock.owned() is True
        lock.release()
        assert replicated.conn.exists(replicated.key("ack")) == 0
        with redmutex.Lock(c, "ack", ttl=30, replicas=1, timeout=5) as again:
            assert replica_conn.get(replicated.key("ack")) == (again.token or "").encode()
    finally:
        replica_conn.close()
        c.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["client-kill", "idle-timeout"])
def test_acquire_after_the_server_closed_idle_connections(replicated: Pair, how: str) -> None:
    """The connection kept for acquire + WAIT, closed by the server while idle (`CLIENT KILL`,
    or its `timeout` setting: a quiet period), is replaced and the acquire sent once more,
    instead of failing with ConnectionError."""
    c = replicated.client()
    try:
        if how == "idle-timeout":
            replicated.conn.config_set("timeout", 1)
        for round in range(3):
            lock = redmutex.Lock(c, "idle", ttl=30, replicas=1)
            assert _outcome(lambda lock=lock: lock.acquire(timeout=5)) is True, round
            lock.release()
            if how == "client-kill":
                replicated.conn.client_kill_filter(_type="normal", skipme=True)
            else:
                time.sleep(2.5)  # the server closes connections idle for more than 1 s
        _assert_no_lock_left(replicated, "idle")
    finally:
        replicated.conn.config_set("timeout", 0)
        c.close()


@pytest.mark.timeout(60)
def test_replica_acknowledges_waiter_and_concurrent_acquires(replicated: Pair) -> None:
    """A replicas=1 waiter gets the lock after a release; concurrent replicas=1 acquires on one
    Client all succeed with a healthy replica."""
    c = replicated.client()
    try:
        holder = redmutex.Lock(c, "wr", ttl=30, replicas=1)
        assert holder.acquire(timeout=5)
        waiter = redmutex.Lock(c, "wr", ttl=30, replicas=1)
        results: list[object] = []
        th = threading.Thread(
            target=lambda: results.append(_outcome(lambda: waiter.acquire(timeout=10)))
        )
        th.start()
        time.sleep(0.3)
        holder.release()
        th.join(15)
        assert results == [True]
        waiter.release()

        errors: list[BaseException] = []
        got: list[bool] = []

        def work(i: int) -> None:
            try:
                for j in range(10):
                    lk = redmutex.Lock(c, f"cc{i}-{j}", ttl=30, replicas=1)
                    got.append(lk.acquire(timeout=5))
                    lk.release()
            except BaseException as exc:  # noqa: BLE001 - inspected below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert got == [True] * 40
    finally:
        c.close()


# ------------------------------------------------------------------------------ failure


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["paused", "stopped"])
def test_unresponsive_replica_fails_within_command_timeout(replicated: Pair, how: str) -> None:
    c = replicated.client()
    replica = replicated.replicas[0]
    try:
        if how == "stopped":
            replica.stop()
            paused: _Paused | None = None
        else:
            paused = _Paused(replica)
            paused.__enter__()
        try:
            lock = redmutex.Lock(c, "unack", ttl=30, replicas=1)
            t0 = time.monotonic()
            assert lock.acquire(timeout=10) is False
            elapsed = time.monotonic() - t0
            print(f"\nreplica {how}: acquire failed after {elapsed:.3f} s")
            assert elapsed < COMMAND_TIMEOUT + MARGIN, elapsed
            assert lock.token is None and lock.fence is None
            _assert_no_lock_left(replicated, "unack")

            # `with` fails like a timeout
            t0 = time.monotonic()
            with (
                pytest.raises(redmutex.LockTimeoutError),
                redmutex.Lock(c, "unack", ttl=30, replicas=1, timeout=10),
            ):
                pass
            assert time.monotonic() - t0 < COMMAND_TIMEOUT + MARGIN
            _assert_no_lock_left(replicated, "unack")

            # the lock was given back: anybody may take it now
            plain = redmutex.Lock(c, "unack", ttl=30)
            assert plain.acquire(timeout=0) is True
            plain.release()
        finally:
            if paused is not None:
                paused.__exit__()
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_paused_replica_does_not_block_other_locks(replicated: Pair) -> None:
    """WAIT blocks its connection; locks without replicas on the same Client carry on."""
    # A WAIT of 4 s (the command timeout): the plain locks must be done while it still blocks.
    # Were they queued behind it on its connection, none could finish before the WAIT ended;
    # checked on the server's state, not on how fast 10 round trips were on a loaded machine.
    wait_for = 4.0
    c = redmutex.Client(replicated.primary.url, prefix=replicated.prefix, command_timeout=wait_for)

    def in_wait() -> bool:
        return any(x["cmd"] == "wait" and "b" in x["flags"] for x in replicated.conn.client_list())

    try:
        warm = redmutex.Lock(c, "warm", ttl=30)
        assert warm.acquire(timeout=5)
        warm.release()
        with _Paused(replicated.replicas[0]):
            results: list[object] = []
            lk = redmutex.Lock(c, "slow", ttl=30, replicas=1)
            th = threading.Thread(
                target=lambda: results.append(_outcome(lambda: lk.acquire(timeout=10)))
            )
            th.start()
            _wait_until(in_wait, 10, "the replicas=1 acquire to block in WAIT")
            t0 = time.monotonic()
            for i in range(5):
                plain = redmutex.Lock(c, f"fast{i}", ttl=30)
                assert plain.acquire(timeout=5) is True
                plain.release()
            fast = time.monotonic() - t0
            still_waiting = in_wait()
            th.join(wait_for + MARGIN + 5)
            assert not th.is_alive()
        print(f"\n5 plain acquire/release pairs took {fast:.3f} s during a WAIT; got {results}")
        assert still_waiting, f"5 plain acquire/release pairs took {fast:.3f} s: past the WAIT"
        assert results == [False]
        _assert_no_lock_left(replicated, "slow")
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_concurrent_acquires_with_paused_replica_fail_like_timeouts(replicated: Pair) -> None:
    """Four threads of one Client try replicas=1 locks while the replica is paused: each fails
    like a timeout (False) within its command timeout; none raises ConnectionError, and none
    succeeds (a WAIT sent on another connection than the write would count nothing to wait for).
    """
    c = replicated.client()
    try:
        warm = redmutex.Lock(c, "warm", ttl=30, replicas=1)
        assert warm.acquire(timeout=5)
        warm.release()
        outcomes: dict[int, object] = {}
        took: dict[int, float] = {}

        def attempt(i: int) -> None:
            t0 = time.monotonic()
            lk = redmutex.Lock(c, f"par{i}", ttl=30, replicas=1)
            outcomes[i] = _outcome(lambda: lk.acquire(timeout=10))
            took[i] = time.monotonic() - t0

        with _Paused(replicated.replicas[0]):
            threads = [threading.Thread(target=attempt, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(4 * (COMMAND_TIMEOUT + MARGIN) + 5)
        print(f"\nconcurrent replicas=1 acquires, replica paused: {outcomes}, took {took}")
        assert outcomes == dict.fromkeys(range(4), False), outcomes
        assert max(took.values()) < COMMAND_TIMEOUT + MARGIN, took
        for i in range(4):
            _assert_no_lock_left(replicated, f"par{i}")
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_two_replicas_required_one_present(replicated: Pair) -> None:
    c = replicated.client()
    try:
        lock = redmutex.Lock(c, "two", ttl=30, replicas=2)
        t0 = time.monotonic()
        assert lock.acquire(timeout=10) is False
        elapsed = time.monotonic() - t0
        assert elapsed < COMMAND_TIMEOUT + MARGIN, elapsed
        assert lock.token is None
        _assert_no_lock_left(replicated, "two")
        # one replica is enough for replicas=1 at the same moment
        one = redmutex.Lock(c, "two", ttl=30, replicas=1)
        assert one.acquire(timeout=5) is True
        one.release()
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_replica_required_none_exist(
    redis_url: str, prefix: str, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    c = redmutex.Client(redis_url, prefix=prefix, command_timeout=COMMAND_TIMEOUT)
    try:
        lock = redmutex.Lock(c, "none", ttl=30, replicas=1)
        t0 = time.monotonic()
        assert lock.acquire(timeout=10) is False
        assert time.monotonic() - t0 < COMMAND_TIMEOUT + MARGIN
        assert r.exists(key_of("none", "lock")) == 0
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_waiter_with_paused_replica_gives_back(replicated: Pair) -> None:
    """A replicas=1 waiter is granted after a release, but the replica is paused: it gives the
    lock back and fails like a timeout instead of keeping an unacknowledged lock."""
    c = replicated.client()
    try:
        holder = redmutex.Lock(c, "wgb", ttl=30)
        assert holder.acquire(timeout=5)
        waiter = redmutex.Lock(c, "wgb", ttl=30, replicas=1)
        results: list[object] = []
        th = threading.Thread(
            target=lambda: results.append(_outcome(lambda: waiter.acquire(timeout=10)))
        )
        with _Paused(replicated.replicas[0]):
            th.start()
            time.sleep(0.3)
            released_at = time.monotonic()
            holder.release()
            th.join(COMMAND_TIMEOUT + MARGIN + 10)
            assert not th.is_alive()
            done_at = time.monotonic()
        assert results == [False]
        print(f"\nwaiter gave the unacknowledged lock back {done_at - released_at:.3f} s after")
        assert done_at - released_at < 10 + MARGIN  # its own timeout
        assert waiter.token is None
        _assert_no_lock_left(replicated, "wgb")
    finally:
        c.close()


def _blocked_in_wait(conn: redis.Redis) -> list[int]:
    """Ids of the clients blocked in WAIT now."""
    return [
        int(client["id"])
        for client in conn.client_list()
        if client.get("cmd") == "wait" and "b" in client.get("flags", "")
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("with_statement", [False, True])
def test_wait_unblocked_with_an_error_fails_like_a_timeout(
    replicated: Pair, with_statement: bool
) -> None:
    """A WAIT that Redis ends with an `UNBLOCKED` error (`CLIENT UNBLOCK id ERROR`; also how a
    master demoted to a replica ends its blocked clients) acknowledged nothing: the lock is
    given back and the acquire fails like a timeout, as when WAIT's own timeout ends it."""
    c = redmutex.Client(replicated.primary.url, prefix=replicated.prefix, command_timeout=10)
    try:
        with _Paused(replicated.replicas[0]):
            lock = redmutex.Lock(c, "unblocked", ttl=30, replicas=1, timeout=20)

            def acquire() -> object:
                if not with_statement:
                    return lock.acquire()
                with lock:
                    return "entered"

            attempt = _Thread(acquire)
            attempt.start()
            _wait_until(lambda: bool(_blocked_in_wait(replicated.conn)), 10, "WAIT to block")
            for client_id in _blocked_in_wait(replicated.conn):
                replicated.conn.execute_command("CLIENT", "UNBLOCK", client_id, "ERROR")
            t0 = time.monotonic()
            if with_statement:
                with pytest.raises(redmutex.LockTimeoutError):
                    attempt.outcome(10)
            else:
                assert attempt.outcome(10) is False
            assert time.monotonic() - t0 < MARGIN
            assert lock.token is None
            _assert_no_lock_left(replicated, "unblocked")
    finally:
        c.close()
