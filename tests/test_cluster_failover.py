"""Redis Cluster failovers that leave every node running: `CLUSTER FAILOVER` (plain, FORCE,
TAKEOVER) on the replica of the master that owns a name, under holds, waiters and fills.

- A failover that keeps the data (the replica was in sync): holds keep working where the slot
  went, waiters (blocking and asyncio) are woken by the release there, a fill runs once.
- A TAKEOVER that loses a hold (its write never reached the replica): the demoted master keeps
  its old data until it has synced from the new one, and must not be asked for it: `owned()`,
  `locked()` and the asyncio ones answer from the new master.

One cluster of 3 masters with a replica each for the module; the processes are ours, stopped or
signalled by their PIDs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redmutex
from _helpers import Paused, ResultThread
from _scale_servers import Cluster, wait_for
from redis.crc import key_slot
from redmutex import aio
from redmutex._server import RedisServer

pytestmark = [pytest.mark.timeout(120), pytest.mark.failover]

PREFIX = "cf:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3, replicas=1, node_timeout_ms=1000) as c:
        yield c


def slot_of(name: str) -> int:
    return int(key_slot(f"{PREFIX}{{{name}}}:lock".encode()))


def a_master(cluster: Cluster) -> RedisServer:
    return next(s for s in cluster.alive() if cluster.role(s) == "master")


def name_on(cluster: Cluster, master: RedisServer, tag: str) -> str:
    return next(
        f"{tag}{i}" for i in range(100_000) if cluster.owner(slot_of(f"{tag}{i}")) is master
    )


def owner_seen_by(cluster: Cluster, server: RedisServer, slot: int) -> int:
    """The port of the master that `server` says owns `slot`."""
    with cluster.conn(server) as r:
        for start, end, master, *_ in r.execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(master[1])
    raise LookupError(slot)


def client_of(cluster: Cluster, seeds: list[RedisServer] | None = None) -> redmutex.Client:
    return redmutex.Client(
        cluster=[s.url for s in (seeds or cluster.alive())],
        prefix=PREFIX,
        connect_timeout=1.0,
        command_timeout=5.0,
    )


# --- a failover that keeps the data -------------------------------------------------------------

PRIMITIVES: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: redmutex.Lock(c, n, ttl=30),
    "fair": lambda c, n: redmutex.Lock(c, n, ttl=30, fair=True),
    "semaphore": lambda c, n: redmutex.Semaphore(c, n, 1, ttl=30),
    "write": lambda c, n: redmutex.RWLock(c, n, ttl=30).write(),
}
AIO_PRIMITIVES: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=30),
    "fair": lambda c, n: aio.Lock(c, n, ttl=30, fair=True),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=30),
    "write": lambda c, n: aio.RWLock(c, n, ttl=30).write(),
}


def blocking_waiter(make: Callable[[], Any]) -> ResultThread:
    def wait() -> float:
        lock = make()
        assert lock.acquire(timeout=20)
        got = time.monotonic()
        lock.release()
        return got

    thread = ResultThread(wait)
    thread.start()
    return thread


def asyncio_waiter(make: Callable[[], Any]) -> ResultThread:
    async def wait() -> float:
        lock = make()
        assert await lock.acquire(timeout=20)
        got = time.monotonic()
        await lock.release()
        return got

    thread = ResultThread(lambda: asyncio.run(wait()))
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["", "FORCE"])
def test_holds_waiters_and_a_fill_ride_out_a_failover(cluster: Cluster, how: str) -> None:
    holders, waiters = client_of(cluster), client_of(cluster, cluster.alive()[::-1])
    master = a_master(cluster)
    replica = cluster.replica_of(master)
    held: dict[str, Any] = {}
    waiting: list[tuple[str, ResultThread]] = []
    for kind, make in PRIMITIVES.items():
        name = name_on(cluster, master, f"{how or 'plain'}-{kind}-")
        held[kind] = make(holders, name)
        assert held[kind].acquire(timeout=5)
        waiting.append((kind, blocking_waiter(lambda m=make, n=name: m(waiters, n))))  # type: ignore[misc]
        waiting.append((kind, asyncio_waiter(lambda n=name, k=kind: AIO_PRIMITIVES[k](waiters, n))))  # type: ignore[misc]
    # A fill runs across the failover; two more callers wait for it.
    key = name_on(cluster, master, f"{how or 'plain'}-fill-")
    fills: list[int] = []

    def fill() -> str:
        fills.append(1)
        time.sleep(1.5)
        return "filled"

    callers = [
        ResultThread(lambda c=c: redmutex.get_or_fill(c, key, fill, ttl=30, timeout=20))  # type: ignore[misc]
        for c in (holders, waiters, waiters)
    ]
    for caller in callers:
        caller.start()
        time.sleep(0.1)
    time.sleep(0.3)
    assert all(t.is_alive() for _, t in waiting)  # all still waiting

    with cluster.conn(replica) as r:
        r.execute_command("CLUSTER", "FAILOVER", *([how] if how else []))
    wait_for("the replica to take over", lambda: cluster.role(replica) == "master", timeout=15)
    wait_for("the cluster to agree", cluster.settled, timeout=15)

    assert [c.outcome(20) for c in callers] == ["filled"] * 3
    assert len(fills) == 1
    for kind, lock in held.items():
        assert lock.owned(), kind
        lock.extend()
        released = time.monotonic()
        lock.release()
        for waiter in [t for k, t in waiting if k == kind]:
            got = waiter.outcome(20)
            assert isinstance(got, float)
            # Woken by the release on the new master, not by the end of the 30 s lease.
            assert got - released < 3.0, f"{kind}: got it {got - released:.1f} s after"
    holders.close()
    waiters.close()


# --- a takeover that loses a hold ---------------------------------------------------------------


def test_a_hold_lost_in_a_takeover_is_not_read_back_from_the_demoted_master(
    cluster: Cluster,
) -> None:
    # The cluster client used to send READONLY on every connection (it does so for any read
    # routing strategy, and one was set only to hear of slot maps). A master demoted by a
    # TAKEOVER then answered reads of its slots from the data it had before (it is a replica of
    # the slot's new master, which READONLY lets serve reads) until it synced: a lost hold read
    # owned() == True and locked() == True, while its extend and release raised LockLostError.
    master = a_master(cluster)
    replica = cluster.replica_of(master)
    others = [s for s in cluster.alive() if s is not master and s is not replica]
    client = client_of(cluster, others)
    lock_name = name_on(cluster, master, "lost-lock-")
    read_name = name_on(cluster, master, "lost-read-")
    slot = slot_of(lock_name)
    with cluster.conn(replica) as r:
        # The demoted master keeps its old data while the new master delays the full sync.
        r.config_set("repl-diskless-sync", "yes")
        r.config_set("repl-diskless-sync-delay", "10")
    lock = redmutex.Lock(client, lock_name, ttl=60)
    reader = redmutex.RWLock(client, read_name, ttl=60).read()
    try:
        with Paused(replica) as stopped_replica:
            with cluster.conn(master) as r:
                assert r.execute_command("CLIENT", "KILL", "TYPE", "replica") >= 1
            # Written while the replica cannot receive them: they stay on the master.
            assert lock.acquire(timeout=5)
            assert reader.acquire(timeout=5)
            with Paused(master) as stopped_master:
                stopped_replica.resume()
                with cluster.conn(replica) as r:
                    r.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
                wait_for(
                    "the takeover",
                    lambda: all(owner_seen_by(cluster, s, slot) == replica.port for s in others),
                    timeout=15,
                )
                stopped_master.resume()
        wait_for("the old master to follow", lambda: cluster.role(master) == "slave", timeout=15)

        def stale_read() -> bytes:
            """The hold as the demoted master still has it (while it answers CLUSTERDOWN, no)."""
            with cluster.conn(master) as r:
                r.execute_command("READONLY")
                return r.get(f"{PREFIX}{{{lock_name}}}:lock")  # type: ignore[no-any-return]

        stale = wait_for("the demoted master to serve reads", stale_read, timeout=5)
        assert stale == (lock.token or "").encode(), "the old master no longer has the hold"

        assert lock.owned() is False
        assert lock.locked() is False
        assert reader.owned() is False

        async def through_the_runtime() -> bool:
            return await aio.Lock(client, lock_name, ttl=5).locked()

        assert asyncio.run(through_the_runtime()) is False
        with pytest.raises(redmutex.LockLostError):
            lock.extend()
        with pytest.raises(redmutex.LockLostError):
            lock.release()
        with pytest.raises(redmutex.LockLostError):
            reader.release()
        # The name is free where it lives now.
        with redmutex.Lock(client, lock_name, ttl=5, timeout=5) as again:
            assert again.owned()
    finally:
        with cluster.conn(replica) as r:
            r.config_set("repl-diskless-sync-delay", "0")
        client.close()
    wait_for("every replica to sync", cluster.replicas_synced, timeout=30)


def test_threads_share_a_client_across_failovers(cluster: Cluster) -> None:
    # Threads on one client while the slot's master changes under them, there and back: no
    # error, and mutual exclusion holds on every side of it. A demoted master answered some of
    # their releases (served from its data, which lagged the new master's by the replication
    # delay): a hold taken on the new master was read as lost.
    client = client_of(cluster)
    master = a_master(cluster)
    replica = cluster.replica_of(master)
    name = name_on(cluster, master, "shared-")
    inside, done, errors = [0], [0], []
    running = threading.Event()
    running.set()

    def work() -> None:
        try:
            while running.is_set():
                with redmutex.Lock(client, name, ttl=10, timeout=15):
                    inside[0] += 1
                    assert inside[0] == 1
                    time.sleep(0.002)
                    inside[0] -= 1
                    done[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for promoted in (replica, master, replica):
            # A master votes for a replica of the same master once per 2 node timeouts.
            time.sleep(2.2)
            with cluster.conn(promoted) as r:
                r.execute_command("CLUSTER", "FAILOVER")
            wait_for("the failover", lambda p=promoted: cluster.role(p) == "master", timeout=15)  # type: ignore[misc]
            wait_for("the demoted master to follow", cluster.replicas_synced, timeout=15)
    finally:
        time.sleep(0.5)
        running.clear()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert done[0] > 20
    client.close()
