"""Sentinel: `redmutex.Client("redis+sentinel://host:port[,host:port...]/service[/db]")`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.sentinel
import redmutex
from _helpers import ResultThread
from _scale_servers import SentinelGroup, wait_for
from redmutex import aio
from redmutex._client import url_of_redis_py

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as g:
        yield g


def lock_value(port: int, name: str) -> bytes | None:
    with redis.Redis(port=port, socket_timeout=5) as r:
        value = r.get(f"s:{{{name}}}:lock")
        return value if isinstance(value, bytes) else None


def test_urls_are_validated_and_redacted() -> None:
    for bad in ["redis+sentinel://h", "redis+sentinel://h:0/svc", "redis+sentinel://h/svc?x=1"]:
        with pytest.raises(ValueError, match="url"):
            redmutex.Client(bad)
    c = redmutex.Client("redis+sentinel://u:hunter2@127.0.0.1:1/svc?sentinel_password=s3cret")
    assert "hunter2" not in repr(c) and "s3cret" not in repr(c)
    # No sentinel answers: a ConnectionError within the timeouts, never a hang.
    c = redmutex.Client(
        "redis+sentinel://127.0.0.1:1/svc", connect_timeout=0.5, command_timeout=0.5
    )
    t0 = time.monotonic()
    with pytest.raises(redmutex.ConnectionError):
        c.ping()
    assert time.monotonic() - t0 < 3


def test_failover_moves_new_acquisitions_to_the_new_master(group: SentinelGroup) -> None:
    client = redmutex.Client(group.url, prefix="s:", connect_timeout=2.0, command_timeout=2.0)
    assert client.ping()
    before = redmutex.Lock(client, "before", ttl=30)
    assert before.acquire(blocking=False)
    assert lock_value(group.master.port, "before") == (before.token or "").encode()
    before.release()
    # A redis-py client made by Sentinel.master_for is followed through the same sentinels.
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", group.sentinel.port)], socket_timeout=2)
    via_redis_py = redmutex.Lock(sentinel.master_for(group.name), "via-redis-py", ttl=30)
    assert via_redis_py.acquire(blocking=False)
    assert via_redis_py.client.url.startswith("redis+sentinel://127.0.0.1:")
    assert redmutex.Lock(client, "x").client is client
    via_redis_py.release()

    # A waiter across the failover: it must not be stranded.
    blocker = redmutex.Lock(client, "across", ttl=4)
    assert blocker.acquire()
    waited: list[bool] = []

    def wait() -> None:
        waited.append(redmutex.Lock(client, "across", ttl=5).acquire(timeout=30))

    waiter = threading.Thread(target=wait)
    waiter.start()

    old, new = group.master, group.replica
    group.failover()
    wait_for("Sentinel to name the new master", lambda: group.master_port() == new.port)

    def follows_the_new_master() -> bool:
        """The +switch-master announcement reached the client: its writes go to `new` (the old
        master takes writes too until Sentinel reconfigures it)."""
        probe = redmutex.Lock(client, "probe-switch", ttl=5)
        if not probe.acquire(timeout=2):
            return False
        there = lock_value(new.port, "probe-switch") == (probe.token or "").encode()
        probe.release()
        return there

    wait_for("the client to follow the new master", follows_the_new_master, timeout=10)

    after = redmutex.Lock(client, "after", ttl=30)
    assert after.acquire(timeout=10)
    assert lock_value(new.port, "after") == (after.token or "").encode()
    with redis.Redis(port=new.port) as r:
        assert r.info("replication")["role"] == "master"
    after.release()
    sem = redmutex.Semaphore(client, "sem-after", 1, ttl=30)
    assert sem.acquire(blocking=False)
    with redis.Redis(port=new.port) as r:
        assert r.exists("s:{sem-after}:sem:holders")
    sem.release()

    waiter.join(30)
    assert waited == [True]

    # Once Sentinel turned the old master into a replica of the new one, replicas=1 succeeds:
    # the lock write is acknowledged by a replica before acquire returns.
    def old_is_replica() -> bool:
        with redis.Redis(port=old.port, socket_timeout=2) as r:
            info = r.info("replication")
            return bool(info["role"] == "slave" and info.get("master_link_status") == "up")

    wait_for("the old master to follow the new one", old_is_replica, timeout=40)
    safe = redmutex.Lock(client, "safe", ttl=30, replicas=1)
    assert safe.acquire(timeout=10)
    assert lock_value(new.port, "safe") == (safe.token or "").encode()
    assert lock_value(old.port, "safe") == (safe.token or "").encode()
    safe.release()
    # Asking for more replicas than exist fails like a timeout.
    assert redmutex.Lock(client, "greedy", ttl=5, replicas=2).acquire(blocking=False) is False


def test_a_hung_sentinel_does_not_hide_a_failover_the_others_announce() -> None:
    # The client listens to every sentinel: the one it found the master through may hang
    # (stopped, cut off) without closing its connection while the others fail over. A busy
    # client's writes must then move to the new master at once, not stay on the demoted one
    # (whose writes are lost when it follows the new master) until Sentinel reconfigures it,
    # about 2 s later here.
    with SentinelGroup(sentinels=3, down_after_ms=1000, failover_timeout_ms=5000) as group:
        client = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=1)
        assert client.ping()
        held: list[tuple[float, redmutex.Lock]] = []
        stop = threading.Event()

        def keep_acquiring() -> None:
            i = 0
            while not stop.is_set() and i < 5000:
                lock = redmutex.Lock(client, f"busy-{i}", ttl=30)
                i += 1
                started = time.monotonic()
                with contextlib.suppress(redmutex.LockError):
                    if lock.acquire(timeout=2):
                        held.append((started, lock))
                time.sleep(0.005)

        worker = threading.Thread(target=keep_acquiring)
        worker.start()
        hung = group.sentinels[0].process
        assert hung is not None
        try:
            time.sleep(0.5)
            os.kill(hung.pid, signal.SIGSTOP)
            group.sentinel = group.sentinels[1]  # the group's own calls go to a live one
            new = group.replica
            group.failover()
            wait_for("Sentinel to name the new master", lambda: group.master_port() == new.port)
            named = time.monotonic()
            time.sleep(1.6)
        finally:
            stop.set()
            worker.join(30)
            os.kill(hung.pid, signal.SIGCONT)
        # Counted from 0.6 s after the naming (the other sentinels' announcement reaching a
        # starved client) until before Sentinel would have reconfigured the demoted master.
        late = [lock for started, lock in held if started > named + 0.6]
        assert len(late) >= 5, f"too few acquisitions after the failover: {len(late)}"
        elsewhere = [
            lock.name
            for lock in late
            if lock_value(new.port, lock.name) != (lock.token or "").encode()
        ]
        assert not elsewhere, f"{len(elsewhere)} of {len(late)} taken on the demoted master"


def test_replicas_waiters_ride_out_a_failover() -> None:
    # replicas=1 waiters while Sentinel replaces a killed master: their attempts go on
    # connections of their own, which must ride out the failover as the other calls do (they
    # raised ConnectionError "broken pipe" on the dead master's connections). With the old
    # master gone no replica is left, so each fails like a timeout, gives the lock back, and
    # returns within its timeout.
    with SentinelGroup(down_after_ms=1000, failover_timeout_ms=5000) as group:
        # The takeover (about 3 s here) is shorter than the command timeout, as calls ride
        # out a failover for up to the command timeout.
        holders = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=6)
        waiters = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=6)
        names = [f"ride-{i}" for i in range(5)]
        for i, name in enumerate(names):
            assert redmutex.Lock(holders, name, ttl=0.5 + 0.6 * i).acquire(timeout=5)
        results: dict[str, object] = {}

        def wait(name: str) -> None:
            started = time.monotonic()
            try:
                outcome: object = redmutex.Lock(waiters, name, ttl=5, replicas=1).acquire(
                    timeout=30
                )
            except Exception as exc:  # noqa: BLE001 - inspected by the test
                outcome = exc
            results[name] = (outcome, time.monotonic() - started)

        threads = [threading.Thread(target=wait, args=(name,)) for name in names]
        for t in threads:
            t.start()
        time.sleep(0.2)
        group.kill_master()
        for t in threads:
            t.join(60)
        assert [results[name][0] for name in names] == [False] * len(names), results
        assert all(float(waited) < 30 + 5 for _, waited in results.values()), results
        with redis.Redis(port=group.master_port(), socket_timeout=5) as r:
            assert r.info("replication")["role"] == "master"
            assert not [name for name in names if r.exists(f"s:{{{name}}}:lock")]


def test_waiters_and_a_fill_across_a_sentinel_failover() -> None:
    # SENTINEL FAILOVER while a hold (replicas=1: it survives) has a blocking and an asyncio
    # waiter on another client, and while a fill runs with a caller waiting for it. After the
    # promotion the hold is released on the new master: both waiters get it at once, not when
    # its 30 s lease ends or their 20 s timeout; the fill ran once and every caller has it.
    with SentinelGroup(down_after_ms=1000, failover_timeout_ms=5000) as group:
        holders = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=5)
        waiters = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=5)
        holder = redmutex.Lock(holders, "across", ttl=30, replicas=1)
        assert holder.acquire(timeout=5)

        def blocking() -> float:
            lock = redmutex.Lock(waiters, "across", ttl=5)
            assert lock.acquire(timeout=20)
            got = time.monotonic()
            lock.release()
            return got

        async def in_asyncio() -> float:
            lock = aio.Lock(waiters, "across", ttl=5)
            assert await lock.acquire(timeout=20)
            got = time.monotonic()
            await lock.release()
            return got

        fills: list[int] = []

        def fill() -> str:
            fills.append(1)
            time.sleep(2)
            return "filled"

        callers = [
            ResultThread(blocking),
            ResultThread(lambda: asyncio.run(in_asyncio())),
            ResultThread(lambda: redmutex.get_or_fill(holders, "k", fill, ttl=30, timeout=20)),
            ResultThread(lambda: redmutex.get_or_fill(waiters, "k", fill, ttl=30, timeout=20)),
        ]
        for caller in callers:
            caller.start()
            time.sleep(0.1)
        new = group.replica
        group.failover()
        wait_for("Sentinel to name the new master", lambda: group.master_port() == new.port)
        assert [c.outcome(20) for c in callers[2:]] == ["filled"] * 2
        assert fills == [1]
        assert holder.owned()
        released = time.monotonic()
        holder.release()
        for waiter in callers[:2]:
            got = waiter.outcome(20)
            assert isinstance(got, float) and got - released < 3, got - released  # type: ignore[operator]
        assert lock_value(new.port, "across") is None


def test_a_waiter_rides_out_a_hung_master() -> None:
    # The master hangs (SIGSTOP: its connections stay open) under a waiter, and Sentinel
    # promotes the replica. The waiter's subscriber keepalive wakes it to look again, on the
    # hung master: that look must move to the new master once the failover is announced (it
    # raised ConnectionError at the command timeout), and the waiter hear the release there.
    with SentinelGroup(down_after_ms=1000, failover_timeout_ms=5000) as group:
        holders = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=4)
        waiters = redmutex.Client(group.url, prefix="s:", connect_timeout=1, command_timeout=4)
        holder = redmutex.Lock(holders, "hung", ttl=30, replicas=1)
        assert holder.acquire(timeout=5)
        woken: dict[str, object] = {}

        def wait() -> None:
            try:
                woken["ok"] = redmutex.Lock(waiters, "hung", ttl=5).acquire(timeout=40)
            except Exception as exc:  # noqa: BLE001 - inspected by the test
                woken["ok"] = exc
            woken["at"] = time.monotonic()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.6)
        hung = group.master.process
        assert hung is not None
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            wait_for(
                "Sentinel to name the new master", lambda: group.master_port() == group.replica.port
            )
            time.sleep(1.0)
            released = time.monotonic()
            holder.release()
            waiter.join(45)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        assert woken.get("ok") is True, woken
        assert float(woken["at"]) - released < 3  # type: ignore[arg-type]


def _silent_ports(count: int) -> tuple[list[socket.socket], list[int]]:
    """Loopback ports that accept connections (kernel backlog) and never answer."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        socks.append(sock)
    return socks, [int(s.getsockname()[1]) for s in socks]


def test_silent_sentinels_fail_within_connect_plus_command_timeout() -> None:
    # The sentinels were asked one after another, each for up to twice the bound, and a blocking
    # call then looked the master up once more through the runtime: 4.5 s for three silent
    # sentinels with a 1.5 s bound, and the message said "1.5 s".
    socks, ports = _silent_ports(3)
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/mymaster/0"
    bound = 1.0 + 0.5
    try:
        for what in ("ping", "acquire", "get_or_fill"):
            client = redmutex.Client(url, connect_timeout=1.0, command_timeout=0.5)
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError, match="timed out after") as caught:
                if what == "ping":
                    client.ping()
                elif what == "acquire":
                    redmutex.Lock(client, "silent").acquire()
                else:
                    redmutex.get_or_fill(client, "silent", lambda: 1, ttl=5)
            took = time.monotonic() - started
            assert took < bound * 1.5, f"{what}: {took:.2f} s ({caught.value})"
    finally:
        for sock in socks:
            sock.close()


def test_a_silent_sentinel_does_not_delay_the_master_the_next_one_names(
    group: SentinelGroup,
) -> None:
    socks, ports = _silent_ports(1)
    url = group.url.replace("sentinel://", f"sentinel://127.0.0.1:{ports[0]},", 1)
    try:
        client = redmutex.Client(url, prefix="s:", connect_timeout=3.0, command_timeout=3.0)
        started = time.monotonic()
        lock = redmutex.Lock(client, "first-answer", ttl=5)
        assert lock.acquire(timeout=10)
        took = time.monotonic() - started
        lock.release()
        assert took < 2.0, f"the first acquire took {took:.2f} s behind a silent sentinel"
    finally:
        for sock in socks:
            sock.close()


def test_the_preferred_sentinels_answer_is_taken_when_it_comes() -> None:
    # Right after a failover some sentinels still name the old master; the client prefers the
    # sentinel that answered last (or announced the failover). Two sentinels naming different
    # masters stand for that: every lookup must take the preferred (first) one's answer, not
    # whichever came first (asked all at once, 5 to 8 of 30 went to the other).
    with SentinelGroup() as first, SentinelGroup() as second:
        url = (
            f"redis+sentinel://127.0.0.1:{first.sentinels[0].port},"
            f"127.0.0.1:{second.sentinels[0].port}/mymaster"
        )
        elsewhere = 0
        for i in range(20):
            client = redmutex.Client(url, prefix="s:", connect_timeout=3, command_timeout=3)
            lock = redmutex.Lock(client, f"pref-{i}", ttl=5)
            assert lock.acquire(timeout=5)
            if lock_value(first.master_port(), lock.name) != (lock.token or "").encode():
                elsewhere += 1
            lock.release()
            client.close()
        assert elsewhere == 0, f"{elsewhere} of 20 lookups took the other sentinel's master"


def test_a_redis_py_sentinel_client_over_tls_stays_on_tls(certificate: tuple[str, str]) -> None:
    with SentinelGroup(tls=certificate) as g:
        for server in (g.master, g.replica):
            with redis.Redis(port=server.port, socket_timeout=5) as r:
                r.execute_command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all")
        tls = {"ssl": True, "ssl_cert_reqs": "none", "socket_timeout": 5}
        sentinel = redis.sentinel.Sentinel(
            [("127.0.0.1", g.link_port(g.sentinel))], sentinel_kwargs=tls
        )
        master = sentinel.master_for(g.name, username="app", password="app-pw", **tls)
        assert master.ping()  # redis-py itself, over TLS
        url = url_of_redis_py(master)[0]
        assert url.startswith("rediss+sentinel://app:") and url.endswith("#insecure"), url
        # The sentinels name the master's TLS port: only a TLS connection gets a lock there.
        with redmutex.Lock(master, "over-tls", ttl=5, timeout=5) as lock:
            assert lock.owned()
        # What a Sentinel URL cannot express is refused, never sent in cleartext.
        plain_sentinels = redis.sentinel.Sentinel([("127.0.0.1", g.sentinel.port)])
        with pytest.raises(ValueError, match="TLS setting"):
            redmutex.Client.from_redis(plain_sentinels.master_for(g.name, **tls))
        # A CA file is carried over for both sides (tests/test_tls.py connects with one).
        with_ca = {"ssl": True, "ssl_ca_certs": certificate[0]}
        ca_sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)], sentinel_kwargs=with_ca)
        url = url_of_redis_py(ca_sentinel.master_for(g.name, **with_ca))[0]
        assert url.startswith("rediss+sentinel://") and "?ssl_ca_certs=" in url, url
        assert not url.endswith("#insecure"), url
        with_ca_data = {"ssl": True, "ssl_ca_data": "-----BEGIN CERTIFICATE-----"}
        data_sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)], sentinel_kwargs=with_ca_data)
        with pytest.raises(ValueError, match="ssl_ca_data is not supported"):
            redmutex.Client.from_redis(data_sentinel.master_for(g.name, **with_ca_data))
