"""Failover for real: the master that holds a lock is SIGKILLed and its replica takes over.

On a Redis Cluster of 3 masters with a replica each, and on a Sentinel-managed master (three
sentinels, plain and `rediss+sentinel://`), one kill per deployment checks at once:
- a hold taken with `replicas=1` survives: the new master has the key, `owned()` is true,
  `extend()` and `release()` work;
- a hold whose write never reached the replica (stopped, its link cut, until the master died)
  is reported lost: `on_lost` is called by renewal, `lost` is true, `release()` raises
  `LockLostError`; the next holder's fence is larger;
- waiters on the failed master's slot, in another client, wake and get the lock;
- no `CROSSSLOT`, no hang: every wait is bounded.

Each deployment is started once per module (a small `cluster-node-timeout` and
`down-after-milliseconds` make the takeover quick); the processes are killed by their PIDs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from _scale_servers import Cluster, SentinelGroup, wait_for
from redis.crc import key_slot
from redmutex._server import RedisServer

pytestmark = [pytest.mark.timeout(150), pytest.mark.failover]

PREFIX = "fo:"
# How long the replica may take to be promoted once its master is killed.
TAKEOVER = 15.0


def key(name: str) -> bytes:
    return f"{PREFIX}{{{name}}}:lock".encode()


def slot_of(name: str) -> int:
    return int(key_slot(key(name)))


def value_on(port: int, name: str, replica: bool = False) -> bytes | None:
    with redis.Redis(port=port, socket_timeout=5) as r:
        if replica:
            r.execute_command("READONLY")
        found = r.get(key(name))
        return found if isinstance(found, bytes) else None


def signal_server(server: RedisServer, sig: signal.Signals) -> None:
    """Sends `sig` to a redis-server this test started (by its PID)."""
    assert server.process is not None
    os.kill(server.process.pid, sig)


class Scenario:
    """The locks and waiters of one kill: `safe` (replicas=1), `lossy` (auto-renewed, written
    while the replica could not receive it), and a waiter on each name from another client.

    The lossy write never reaches the replica: the replica is stopped (SIGSTOP) and its link cut
    by the master (CLIENT KILL TYPE replica) before the acquire, so the write stays in the
    master's backlog; the test kills the master before it resumes the replica (`resume`)."""

    def __init__(
        self,
        client: redmutex.Client,
        other: redmutex.Client,
        names: tuple[str, str],
        master: RedisServer,
        replica: RedisServer,
        on_replica: Callable[[str], bytes | None],
    ) -> None:
        self.safe_name, self.lossy_name = names
        self.replica = replica
        self.safe = redmutex.Lock(client, self.safe_name, ttl=30, replicas=1)
        assert self.safe.acquire(timeout=10)
        assert on_replica(self.safe_name) == (self.safe.token or "").encode()
        self.lost_calls: list[float] = []
        self.lossy = redmutex.Lock(
            client,
            self.lossy_name,
            ttl=3,
            auto_renew=True,
            on_lost=lambda _: self.lost_calls.append(time.monotonic()),
        )
        self.results: dict[str, tuple[bool, float, int | None]] = {}
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self.wait, args=(other, n), daemon=True) for n in names
        ]
        signal_server(replica, signal.SIGSTOP)
        self.stopped = True
        with redis.Redis(port=master.port, socket_timeout=5) as r:
            assert r.execute_command("CLIENT", "KILL", "TYPE", "replica") >= 1
        assert self.lossy.acquire(timeout=5)
        self.lossy_fence = self.lossy.fence
        for t in self.threads:
            t.start()
        time.sleep(0.1)
        assert not self.results and not self.errors

    def resume(self) -> None:
        """Lets the replica run again (after its master was killed)."""
        if self.stopped:
            signal_server(self.replica, signal.SIGCONT)
            self.stopped = False

    def wait(self, client: redmutex.Client, name: str) -> None:
        t0 = time.monotonic()
        try:
            lock = redmutex.Lock(client, name, ttl=10)
            ok = lock.acquire(timeout=45)
            self.results[name] = (ok, time.monotonic() - t0, lock.fence)
            if ok:
                lock.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def check_after_takeover(self, new_master_port: int) -> None:
        # With replicas=1 the hold survived: the new master has it, and it keeps working.
        assert value_on(new_master_port, self.safe_name) == (self.safe.token or "").encode()
        assert self.safe.owned() and not self.safe.lost
        self.safe.extend()
        assert not self.results.get(self.safe_name)
        released_at = time.monotonic()
        self.safe.release()
        # The other: renewal finds it gone and says so; release reports the loss.
        wait_for("renewal to report the loss", lambda: self.lost_calls, timeout=10)
        assert len(self.lost_calls) == 1 and self.lossy.lost
        assert self.lossy.owned() is False
        with pytest.raises(redmutex.LockLostError):
            self.lossy.release()
        # Both waiters got the lock, within their bounds.
        for t in self.threads:
            t.join(50)
        assert not self.errors, self.errors
        safe_ok, safe_waited, _ = self.results[self.safe_name]
        assert safe_ok
        # Woken by the release, not by the end of the 30 s lease.
        assert time.monotonic() - released_at < 5 or safe_waited < 25
        lossy_ok, _, lossy_fence = self.results[self.lossy_name]
        assert lossy_ok
        assert lossy_fence is not None and self.lossy_fence is not None
        assert lossy_fence > self.lossy_fence


# --- Redis Cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3, replicas=1, node_timeout_ms=1000) as c:
        yield c


def name_on(cluster: Cluster, master: RedisServer, tag: str) -> str:
    """A name whose slot the given master owns."""
    for i in range(100_000):
        candidate = f"{tag}{i}"
        if cluster.owner(slot_of(candidate)) is master:
            return candidate
    raise LookupError(tag)


def test_cluster_master_killed_under_holds_and_waiters(cluster: Cluster) -> None:
    # Calls ride out a takeover for up to the command timeout: a margin over the expected one.
    timeouts = {"connect_timeout": 1.0, "command_timeout": 10.0}
    client = redmutex.Client(cluster=cluster.urls, prefix=PREFIX, **timeouts)
    other = redmutex.Client(cluster=cluster.urls[::-1], prefix=PREFIX, **timeouts)
    victim = next(s for s in cluster.servers if cluster.role(s) == "master")
    replica = cluster.replica_of(victim)
    names = (name_on(cluster, victim, "safe"), name_on(cluster, victim, "lossy"))

    scenario = Scenario(
        client, other, names, victim, replica, lambda n: value_on(replica.port, n, replica=True)
    )
    try:
        killed_at = time.monotonic()
        cluster.kill(victim)
    finally:
        scenario.resume()

    def promoted() -> bool:
        return cluster.role(replica) == "master" and all(
            cluster.owner(slot_of(n)) is replica for n in names
        )

    wait_for("the replica to take over", promoted, timeout=TAKEOVER)
    took = time.monotonic() - killed_at
    scenario.check_after_takeover(replica.port)
    # Locks on every slot work after the takeover, the failed master's included (no CROSSSLOT).
    for n in [f"after{i}" for i in range(60)] + list(names):
        with redmutex.Lock(client, n, ttl=5, timeout=10) as lock:
            assert lock.owned()
    assert took < TAKEOVER


# --- Sentinel -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["redis+sentinel", "rediss+sentinel"])
def group(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SentinelGroup]:
    tls = request.getfixturevalue("certificate") if request.param == "rediss+sentinel" else None
    with SentinelGroup(
        "failover", sentinels=3, down_after_ms=1000, failover_timeout_ms=5000, tls=tls
    ) as g:
        yield g


def test_sentinel_master_killed_under_holds_and_waiters(group: SentinelGroup) -> None:
    assert group.url.startswith("rediss+" if group.tls else "redis+")
    # Calls ride out a takeover for up to the command timeout: a margin over the expected one.
    timeouts = {"connect_timeout": 1.0, "command_timeout": 10.0}
    client = redmutex.Client(group.url, prefix=PREFIX, **timeouts)
    other = redmutex.Client(group.url, prefix=PREFIX, **timeouts)
    assert client.ping()
    old, new = group.master, group.replica

    scenario = Scenario(client, other, ("safe", "lossy"), old, new, lambda n: value_on(new.port, n))
    try:
        killed_at = time.monotonic()
        assert group.kill_master() is old
    finally:
        scenario.resume()

    def promoted() -> bool:
        with redis.Redis(port=new.port, socket_timeout=2) as r:
            role = r.info("replication")["role"]
        return role == "master" and group.master_port() == group.link_port(new)

    wait_for("Sentinel to promote the replica", promoted, timeout=TAKEOVER)
    took = time.monotonic() - killed_at
    scenario.check_after_takeover(new.port)
    for n in [f"after{i}" for i in range(20)]:
        with redmutex.Lock(client, n, ttl=5, timeout=10) as lock:
            assert lock.owned()
            assert value_on(new.port, n) == (lock.token or "").encode()
    assert took < TAKEOVER
