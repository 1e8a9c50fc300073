"""Redis Cluster: `redmutex.Client(cluster=[url, ...])` on a 3-master cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redmutex
from _helpers import wait_until
from _scale_servers import Cluster
from redis.crc import key_slot
from redmutex import _core, aio

pytestmark = pytest.mark.timeout(180)

PREFIX = "c:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> redmutex.Client:
    return cluster.client(PREFIX)


def slot_of(name: str) -> int:
    return int(key_slot(f"{PREFIX}{{{name}}}:lock".encode()))


def name_on(cluster: Cluster, server_index: int, tag: str = "") -> str:
    """A name whose slot belongs to the given node."""
    server = cluster.servers[server_index]
    for i in range(100_000):
        candidate = f"on{server_index}-{tag}{i}"
        if cluster.owner(slot_of(candidate)) is server:
            return candidate
    raise LookupError


def test_constructor(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="cluster"):
        redmutex.Client(cluster=[])
    with pytest.raises(ValueError, match="cluster"):
        redmutex.Client(cluster=["unix:///tmp/x.sock"])
    with pytest.raises(ValueError, match="cluster"):
        redmutex.Client(cluster=["redis://127.0.0.1:1/3"])
    with pytest.raises(TypeError, match="cluster"):
        redmutex.Client(cluster="redis://127.0.0.1:1")
    with pytest.raises(ValueError, match="prefix"):
        redmutex.Client(cluster=cluster.urls, prefix="a{}")
    c = redmutex.Client(cluster=["redis://u:hunter2@127.0.0.1:1"])
    assert repr(c).startswith("Client(cluster=[") and "hunter2" not in repr(c)


def test_locks_on_1000_names_across_all_slots(cluster: Cluster, client: redmutex.Client) -> None:
    assert client.ping()
    names = [uuid.uuid4().hex for _ in range(990)]
    # Braces, NUL and non-ASCII are fine too: every key of a name shares its slot.
    names += ["a{b}c", "{x}", "x}", "a\0b", "ünï", "{", "x}}{", "k" * 300, "{}", "a{}"]
    owners = set()
    for n in names:
        lock = redmutex.Lock(client, n, ttl=10)
        assert lock.acquire(blocking=False), n
        assert lock.fence is not None and lock.fence >= 1
        assert lock.owned()
        lock.extend()
        lock.release()
        owners.add(cluster.owner(slot_of(n)).port)
    assert owners == {s.port for s in cluster.servers}
    # Nothing is left but the fence counters.
    for server in cluster.servers:
        with cluster.conn(server) as r:
            leftovers = [k for k in r.scan_iter(match=f"{PREFIX}*") if not k.endswith(b":fence")]
            assert leftovers == []
    # A name starting with '}' would leave the hash tag empty: refused, not CROSSSLOT.
    with pytest.raises(ValueError, match="^name: on Redis Cluster"):
        redmutex.Lock(client, "}x")
    # The error names the argument the name came in (it said `name` for all of them).
    with pytest.raises(ValueError, match="^key: on Redis Cluster"):
        redmutex.get_or_fill(client, "}x", lambda: 1, ttl=5)
    with pytest.raises(ValueError, match="^lockname: on Redis Cluster"):
        redmutex.acquire_lock(client, "}x")
    with pytest.raises(ValueError, match="^names: on Redis Cluster"):
        redmutex.MultiLock(client, ["a", "}x"])


def test_locks_from_many_threads(client: redmutex.Client) -> None:
    errors: list[BaseException] = []
    counter = {"n": 0, "inside": 0}

    def work() -> None:
        try:
            for _ in range(20):
                with redmutex.Lock(client, "shared-counter", ttl=10, timeout=30):
                    counter["inside"] += 1
                    assert counter["inside"] == 1
                    counter["n"] += 1
                    counter["inside"] -= 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and counter["n"] == 160


@pytest.mark.parametrize("index", [0, 1, 2])
def test_wakeups_reach_waiters_on_every_node(
    cluster: Cluster, client: redmutex.Client, index: int
) -> None:
    n = name_on(cluster, index, "wake")
    holder = redmutex.Lock(client, n, ttl=30)
    assert holder.acquire()
    other = redmutex.Client(cluster=cluster.urls[::-1], prefix=PREFIX)
    got: list[float] = []

    def wait() -> None:
        waiter = redmutex.Lock(other, n, ttl=5)
        t0 = time.monotonic()
        assert waiter.acquire(timeout=10)
        got.append(time.monotonic() - t0)
        waiter.release()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    holder.release()
    t.join(15)
    # Woken by the release (at ~0.3 s), not by the 30 s lease end.
    assert got and got[0] < 2.0, got


def test_fair_lock_auto_renew_and_asyncio(cluster: Cluster, client: redmutex.Client) -> None:
    n = name_on(cluster, 1, "fair")
    first = redmutex.Lock(client, n, ttl=10, fair=True)
    assert first.acquire()
    order: list[int] = []

    def wait(i: int) -> None:
        lock = redmutex.Lock(client, n, ttl=10, fair=True)
        assert lock.acquire(timeout=10)
        order.append(i)
        lock.release()

    queue = f"{PREFIX}{{{n}}}:lock:queue".encode()
    threads = []
    with cluster.conn(cluster.owner(slot_of(n))) as r:
        for i in range(3):
            t = threading.Thread(target=wait, args=(i,))
            t.start()
            threads.append(t)
            # staggered: the next one starts once this one has its place in the queue
            wait_until(lambda i=i: r.hlen(queue) == i + 1, 20, f"waiter {i} to queue")  # type: ignore[misc]
    first.release()
    for t in threads:
        t.join(15)
    assert order == [0, 1, 2]

    renewed = redmutex.Lock(client, n, ttl=1.5, auto_renew=True)
    with renewed:
        time.sleep(4.6)  # more than three leases
        assert renewed.owned() and not renewed.lost

    async def main() -> None:
        from redmutex import aio

        lock = aio.Lock(client, n, ttl=5)
        async with lock:
            other = aio.Lock(client, n, ttl=5)
            waiting = asyncio.ensure_future(other.acquire(timeout=5))
            await asyncio.sleep(0.2)
            assert not waiting.done()
        assert await waiting
        await other.release()

    asyncio.run(main())


@pytest.mark.parametrize("index", [0, 1, 2])
def test_semaphore_and_rwlock_on_every_node(
    cluster: Cluster, client: redmutex.Client, index: int
) -> None:
    n = name_on(cluster, index, "prim")
    first = redmutex.Semaphore(client, n, 2, ttl=10)
    second = redmutex.Semaphore(client, n, 2, ttl=10)
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    assert first.holders() == 2
    third = redmutex.Semaphore(client, n, 2, ttl=10)
    assert third.acquire(blocking=False) is False
    threading.Timer(0.3, first.release).start()
    t0 = time.monotonic()
    assert third.acquire(timeout=10)
    assert time.monotonic() - t0 < 2.0  # woken by the release
    second.release()
    third.release()

    # The readers through another client: one client's RWLock objects of a name share the
    # deadlock guard, so this thread's write acquire would raise instead of waiting.
    rw = redmutex.RWLock(cluster.client(PREFIX), n + ":rw", ttl=10)
    r1, r2 = rw.read(), rw.read()
    assert r1.acquire(blocking=False) and r2.acquire(blocking=False)
    writer = redmutex.RWLock(client, n + ":rw", ttl=10).write()
    assert writer.acquire(blocking=False) is False
    r1.release()
    threading.Timer(0.3, r2.release).start()
    t0 = time.monotonic()
    assert writer.acquire(timeout=10)
    assert time.monotonic() - t0 < 2.0
    writer.release()


def test_recipes(client: redmutex.Client) -> None:
    identifier = redmutex.acquire_lock(client, "recipe", atime=1, ltime=5)
    assert identifier
    assert redmutex.acquire_lock(client, "recipe", atime=0.1, ltime=5) is False
    assert redmutex.release_lock(client, "recipe", identifier)
    with redmutex.redis_lock(client, "recipe", atime=1, ltime=5) as ident:
        assert len(ident) == 32

    @redmutex.locked(client, "acct:{who}", ttl=5, timeout=5)
    def pay(who: str) -> str:
        return who

    assert pay("alice") == "alice"


def test_lock_survives_a_slot_migration(cluster: Cluster, client: redmutex.Client) -> None:
    source = cluster.servers[0]
    target = cluster.servers[1]
    slot = cluster.lowest_slot(source)
    n = next(f"mig{i}" for i in range(1_000_000) if slot_of(f"mig{i}") == slot)
    holder = redmutex.Lock(client, n, ttl=60)
    assert holder.acquire()
    got: list[float] = []

    def wait() -> None:
        waiter = redmutex.Lock(client, n, ttl=5)
        assert waiter.acquire(timeout=60)
        got.append(time.monotonic())
        assert waiter.fence is not None and holder_fence is not None
        assert waiter.fence > holder_fence
        waiter.release()

    holder_fence = holder.fence
    t = threading.Thread(target=wait)
    t.start()
    cluster.reshard_lowest_slot(source, target)
    assert cluster.owner(slot) is target
    with cluster.conn(target) as r:
        r.execute_command("READONLY")
        assert r.get(f"{PREFIX}{{{n}}}:lock".encode()) == (holder.token or "").encode()
    # The hold keeps working where the slot went (MOVED is followed).
    assert holder.owned() and holder.locked()
    holder.extend(60)
    time.sleep(0.2)
    assert not got
    released_at = time.monotonic()
    holder.release()
    t.join(20)
    # The waiter was woken by the release, on the node that now owns the slot.
    assert got and got[0] - released_at < 2.0
    # New acquisitions work there too.
    with redmutex.Lock(client, n, ttl=5, timeout=5) as again:
        assert again.fence is not None and holder_fence is not None
        assert again.fence > holder_fence + 1


def test_replicas_unacknowledged_fails_like_a_timeout(cluster: Cluster) -> None:
    # No replica at all: WAIT answers 0 after the command timeout, so the attempt fails like a
    # timeout and gives the lock back, as on a single server (the cluster connection must not
    # give up on WAIT's answer first, which raised ConnectionError).
    c = redmutex.Client(cluster=cluster.urls, prefix=PREFIX, connect_timeout=2, command_timeout=1)
    try:
        for i in range(3):
            name = name_on(cluster, i, "unacked")
            lock = redmutex.Lock(c, name, ttl=10, replicas=1)
            started = time.monotonic()
            assert lock.acquire(timeout=0) is False
            assert time.monotonic() - started < 1 + 3
            with cluster.conn(cluster.owner(slot_of(name))) as r:
                assert r.exists(f"{PREFIX}{{{name}}}:lock") == 0
        unacked = redmutex.Lock(c, name_on(cluster, 0, "unacked-with"), replicas=1, timeout=1.5)
        with pytest.raises(redmutex.LockTimeoutError), unacked:
            pass
    finally:
        c.close()


def test_no_crossslot_from_redis_py_view(cluster: Cluster, client: redmutex.Client) -> None:
    # The keys of one name really live in one slot on one node, as Redis itself sees it.
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    try:
        for n in ["a", "a{b}c", "x}", "{"]:
            lock = redmutex.Lock(client, n, ttl=10, fair=True)
            assert lock.acquire(blocking=False)
            base = f"{PREFIX}{{{n}}}"
            slots = {rc.keyslot(f"{base}{suffix}") for suffix in (":lock", ":fence", ":queue")}
            assert len(slots) == 1
            lock.release()
        # A redis-py RedisCluster works as the `client` argument too.
        with redmutex.Lock(rc, "via-redis-py", ttl=5, timeout=5) as lock:
            assert lock.client.url.count("redis://") == 3
            assert lock.locked()
    finally:
        rc.close()


def test_blocking_cache_runs_through_the_runtime(client: redmutex.Client) -> None:
    # One-round-trip cache steps go to the slot's node directly; the wait for another caller's
    # fill goes through the runtime.
    name = f"cache-{uuid.uuid4().hex}"
    store = _core.CacheStore(client, ttl=30, lock_ttl=10)
    claim = store.fetch(name)
    assert isinstance(claim, _core.FillClaim) and claim.held
    assert store.fetch(name, timeout=0) is None  # another caller fills
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(store.fetch(name, timeout=20)))
    waiter.start()
    time.sleep(0.2)
    assert claim.store(b"filled") is True
    waiter.join(30)
    hit = got[0]
    assert isinstance(hit, _core.CacheHit) and hit.payload == b"filled"
    store.invalidate(name)
    again = store.fetch(name)
    assert isinstance(again, _core.FillClaim)
    assert again.abandon() is True
    assert isinstance(store.fetch(name), _core.FillClaim)


def test_a_dead_master_is_a_connection_error_within_the_command_timeout() -> None:
    # A master without replica dies: its slots answer MOVED to it, or CLUSTERDOWN, for as long
    # as the command timeout allows; then the caller gets redmutex.ConnectionError (what a
    # retry on an unreachable server catches), not a LockError quoting the redirection.
    with Cluster(3) as cl:
        c = redmutex.Client(cluster=cl.urls, prefix=PREFIX, connect_timeout=1, command_timeout=1.5)
        name = name_on(cl, 2, "dead")
        held = redmutex.Lock(c, name, ttl=5)
        assert held.acquire(timeout=5)
        cl.kill(cl.servers[2])
        for call in (
            held.release,
            lambda: redmutex.Lock(c, name, ttl=5).acquire(timeout=0),
            lambda: redmutex.Semaphore(c, name, 2, ttl=5).acquire(timeout=0),
        ):
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError, match="timed out after"):
                call()
            assert time.monotonic() - started < 10


def test_a_hung_subscriber_node_strands_no_waiter() -> None:
    # Each client's wake-up subscriber sits on one node (the first seed here). That node hangs
    # without closing its connections (SIGSTOP; its replica takes over): a MultiLock waiter,
    # which has no queue place to refresh, must still hear the release (not wait out the
    # holder's 20 s lease), and a client whose subscriber was idle then must subscribe
    # elsewhere when it next waits (not fail with a SUBSCRIBE timeout).
    with Cluster(3, replicas=1, node_timeout_ms=1000) as cl:
        hung = cl.servers[0]
        assert cl.role(hung) == "master"
        other = next(
            i for i, s in enumerate(cl.servers) if s is not hung and cl.role(s) == "master"
        )
        first, second = name_on(cl, other, "hang-a"), name_on(cl, other, "hang-b")

        def client() -> redmutex.Client:
            return redmutex.Client(
                cluster=cl.urls, prefix=PREFIX, connect_timeout=1, command_timeout=4
            )

        holders, waiting, idle = client(), client(), client()
        holder = redmutex.Lock(holders, first, ttl=20)
        assert holder.acquire()
        # The idle client's subscriber opens (on the first seed) and then has nobody waiting.
        assert redmutex.Lock(idle, first, ttl=5).acquire(timeout=0.3) is False
        woken: dict[str, float | bool] = {}

        def wait() -> None:
            multi = redmutex.MultiLock(waiting, [first], ttl=10)
            woken["ok"] = multi.acquire(timeout=60)
            woken["at"] = time.monotonic()
            multi.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.5)
        assert hung.process is not None
        os.kill(hung.process.pid, signal.SIGSTOP)
        try:
            time.sleep(4)  # the replica has taken over
            released = time.monotonic()
            holder.release()
            waiter.join(40)
            assert woken.get("ok") is True
            assert float(woken["at"]) - released < 3, f"woken {woken['at'] - released:.1f} s late"
            # The idle client waits on another held name, released 1 s later.
            second_holder = redmutex.Lock(holders, second, ttl=20)
            assert second_holder.acquire()
            threading.Timer(1.0, second_holder.release).start()
            assert redmutex.Lock(idle, second, ttl=5).acquire(timeout=15)
        finally:
            os.kill(hung.process.pid, signal.SIGCONT)


def test_waiters_are_woken_after_every_seed_died() -> None:
    # One seed is enough to start; nodes come and go. The client's only seed (a replica, so the
    # cluster stays whole) dies: the wake-up subscriber opened on the primaries the client has
    # learned of since. It was only ever opened on the seeds, so every waiter failed with
    # ConnectionError after the command timeout, though the lock was released long before.
    with Cluster(3, replicas=1, node_timeout_ms=1000) as cl:
        seed = next(s for s in cl.servers if cl.role(s) == "slave")
        c = redmutex.Client(cluster=[seed.url], prefix=PREFIX, connect_timeout=1, command_timeout=4)
        name = name_on(cl, 1, "seedless")
        holder = redmutex.Lock(c, name, ttl=20)
        assert holder.acquire(timeout=5)  # the client has learned the cluster's map
        cl.kill(seed)
        for kind in ("lock", "fair", "semaphore"):
            waiter: Any = (
                redmutex.Semaphore(c, name + kind, 1, ttl=20)
                if kind == "semaphore"
                else redmutex.Lock(c, name + kind, ttl=20, fair=kind == "fair")
            )
            held: Any = (
                redmutex.Semaphore(c, name + kind, 1, ttl=20)
                if kind == "semaphore"
                else redmutex.Lock(c, name + kind, ttl=20, fair=kind == "fair")
            )
            assert held.acquire(timeout=5)
            released = threading.Timer(1.0, held.release)
            released.start()
            started = time.monotonic()
            assert waiter.acquire(timeout=10), kind
            took = time.monotonic() - started
            released.join()
            assert 0.8 < took < 3, f"{kind}: acquired after {took:.1f} s"
            waiter.release()
        holder.release()
        c.close()


def test_a_name_on_a_healthy_master_is_served_while_another_master_hangs() -> None:
    # A script missing on the name's node (new node, promoted replica, SCRIPT FLUSH) was loaded
    # by redis-rs with SCRIPT LOAD on every primary, which fails while any one hangs: a try-once
    # acquire of a name on a healthy master raised ConnectionError after the command timeout.
    with Cluster(3, node_timeout_ms=60000) as cl:
        c = redmutex.Client(cluster=cl.urls, prefix=PREFIX, connect_timeout=1, command_timeout=2)
        assert c.ping()
        hung, healthy = cl.servers[0], cl.servers[1]
        name, other = name_on(cl, 1, "healthy-"), name_on(cl, 2, "healthy-")
        with redis.Redis(port=healthy.port, socket_timeout=5) as r:
            r.script_flush()
        assert hung.process is not None
        os.kill(hung.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()

            async def through_the_runtime() -> None:
                lock = aio.Lock(c, name, ttl=10)
                assert await lock.acquire(timeout=0)
                await lock.release()

            asyncio.run(through_the_runtime())
            multi = redmutex.MultiLock(c, [name, other], ttl=10)
            assert multi.acquire(timeout=0)
            multi.release()
            assert time.monotonic() - started < 3.0
        finally:
            os.kill(hung.process.pid, signal.SIGCONT)
