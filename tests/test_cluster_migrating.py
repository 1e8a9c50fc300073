"""Scripts while their slot is MIGRATING, keys still on the source node (every reshard passes
through this state before MIGRATE moves the keys).

Redis Cluster checks each command a script issues: on the source node of a migrating slot, a key
that is missing counts as another node's, so a script that touches a key it has itself emptied
(the ZREM of a zset's last member deletes the zset) aborts with "Script attempted to access a non
local key in a cluster node" after the commands before it ran. These tests run each script whose
earlier version did that, from the state that made it, on the source node of a real 3-master
cluster; and the Semaphore and RWLock, a release with a waiter and a waiter admitted, through the
public API. Every migration is cancelled (SETSLOT STABLE on both nodes) in a finally."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redmutex
from _helpers import ResultThread
from _scale_servers import Cluster, wait_for
from redis.crc import key_slot
from redmutex._core import _script_source
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(180)

PREFIX = "m:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> redmutex.Client:
    return cluster.client(PREFIX)


def slot_of(key: str) -> int:
    return int(key_slot(key.encode()))


def source_of(cluster: Cluster, key: str) -> redis.Redis:
    return cluster.conn(cluster.owner(slot_of(key)))


@contextmanager
def migrating(cluster: Cluster, slot: int) -> Iterator[RedisServer]:
    """The slot MIGRATING from its owner to another master (IMPORTING there), its keys left on
    the owner, which is yielded; cancelled (STABLE on both) on the way out."""
    source = cluster.owner(slot)
    target = next(s for s in cluster.servers if s is not source)
    with cluster.conn(target) as r:
        r.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
    try:
        with cluster.conn(source) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
        yield source
    finally:
        for server in (source, target):
            with cluster.conn(server) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def subscribed(r: redis.Redis, channel: str) -> Any:
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    confirmed = pubsub.get_message(timeout=5)
    assert confirmed is not None and confirmed["type"] == "subscribe"
    return pubsub


def messages(pubsub: Any) -> list[bytes]:
    got = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        got.append(message["data"])
    return got


def now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- each script, from the state in which its earlier version touched a key it had deleted ------


def test_sem_release_of_the_last_holder_wakes_the_queue_head(cluster: Cluster) -> None:
    base = "{s-rel}"
    holders, queue, deadlines, limit = (f"{base}:h", f"{base}:q", f"{base}:d", f"{base}:l")
    r = source_of(cluster, holders)
    now = now_ms(r)
    r.zadd(holders, {"a": now + 30_000})
    r.rpush(queue, "w")
    r.zadd(deadlines, {"w": now + 30_000})
    r.set(limit, "1", px=30_000)
    pubsub = subscribed(r, f"{base}:wake")
    release = r.register_script(_script_source("sem_release"))
    with migrating(cluster, slot_of(holders)):
        # (the holders' zset goes with "a": the old script counted it after)
        assert release(keys=[holders, queue, deadlines, limit], args=["a", 1, f"{base}:wake"]) == 1
    assert messages(pubsub) == [b"w"]
    assert r.exists(holders) == 0 and r.lrange(queue, 0, -1) == [b"w"]


@pytest.mark.parametrize("ended_holder", [False, True])
def test_sem_acquire_admits_the_last_waiter(cluster: Cluster, ended_holder: bool) -> None:
    base = "{s-acq}" if ended_holder else "{s-acq2}"
    holders, queue, deadlines, limit = (f"{base}:h", f"{base}:q", f"{base}:d", f"{base}:l")
    r = source_of(cluster, holders)
    now = now_ms(r)
    # A live holder, one permit free; or only an ended lease left in the key (no permit taken).
    r.zadd(holders, {"a": now - 1_000 if ended_holder else now + 30_000})
    r.pexpire(holders, 30_000)
    r.rpush(queue, "w")
    r.zadd(deadlines, {"w": now + 30_000})
    r.set(limit, "2", px=30_000)
    acquire = r.register_script(_script_source("sem_acquire"))
    with migrating(cluster, slot_of(holders)):
        # (its place goes from both keys, the last in each: the old script read their ttl after)
        granted = acquire(
            keys=[holders, queue, deadlines, limit], args=["w", 30_000, 2, "2", 10_000]
        )
    assert granted == (1 if ended_holder else 2)
    assert set(r.zrangebyscore(holders, now, "+inf")) == ({b"w"} if ended_holder else {b"a", b"w"})
    assert r.exists(queue, deadlines) == 0
    assert 25_000 < r.pttl(limit) <= 30_000


def test_sem_leave_behind_an_ended_lease_wakes_the_next(cluster: Cluster) -> None:
    base = "{s-leave}"
    holders, queue, deadlines, limit = (f"{base}:h", f"{base}:q", f"{base}:d", f"{base}:l")
    r = source_of(cluster, holders)
    now = now_ms(r)
    r.zadd(holders, {"a": now - 1_000})  # ended, its key not yet expired
    r.pexpire(holders, 30_000)
    r.rpush(queue, "w", "v")
    r.zadd(deadlines, {"w": now + 30_000, "v": now + 30_000})
    r.set(limit, "1", px=30_000)
    pubsub = subscribed(r, f"{base}:wake")
    leave = r.register_script(_script_source("sem_leave"))
    with migrating(cluster, slot_of(holders)):
        assert leave(keys=[holders, queue, deadlines, limit], args=["w", 1, f"{base}:wake"]) == 1
    assert messages(pubsub) == [b"v"]
    assert r.lrange(queue, 0, -1) == [b"v"]


def test_rw_read_release_of_the_last_reader_wakes_the_writer(cluster: Cluster) -> None:
    base = "{rw-rel}"
    readers, waiting = f"{base}:readers", f"{base}:waiting"
    r = source_of(cluster, readers)
    now = now_ms(r)
    r.zadd(readers, {"r": now + 30_000})
    r.zadd(waiting, {"w": now + 30_000})
    pubsub = subscribed(r, f"{base}:wake")
    release = r.register_script(_script_source("rw_read_release"))
    with migrating(cluster, slot_of(readers)):
        assert release(keys=[readers, waiting], args=["r", f"{base}:wake"]) == 1
    assert messages(pubsub) == [b"w"]
    assert r.exists(readers) == 0


def test_queue_leave_gives_a_grant_on_to_the_next_waiter(cluster: Cluster) -> None:
    base = "{q-leave}"
    lock, fence, places = f"{base}:lock", f"{base}:fence", f"{base}:queue"
    r = source_of(cluster, lock)
    now = now_ms(r)
    # "w" was granted the lock while it gave up; "v" queues behind it.
    r.set(lock, "w", px=30_000)
    r.set(fence, "1", px=30_000)
    r.hset(places, "v", f"{now * 1000} {now + 30_000} 10000 ")
    pubsub = subscribed(r, f"{base}:wake")
    leave = r.register_script(_script_source("queue_leave"))
    with migrating(cluster, slot_of(lock)):
        assert leave(keys=[lock, fence, places], args=["w", f"{base}:wake", 3000, 86_400_000]) == 1
    (grant,) = messages(pubsub)
    assert grant.split()[0] == b"v"
    assert r.get(lock) == b"v" and r.exists(places) == 0


@pytest.mark.parametrize("script", ["compat_signal_release", "compat_reset"])
def test_compat_signal_list_is_pushed_anew(cluster: Cluster, script: str) -> None:
    lock, signal = f"lock:{{c-{script}}}", f"lock-signal:{{c-{script}}}"
    r = source_of(cluster, lock)
    r.set(lock, "t", px=30_000)
    r.rpush(signal, 1, 1)  # left by earlier releases
    run = r.register_script(_script_source(script))
    args = ["t", "wake", 5_000] if script == "compat_signal_release" else ["wake", 5_000]
    with migrating(cluster, slot_of(lock)):
        assert run(keys=[lock, signal], args=args) == 1
    assert r.exists(lock) == 0 and r.lrange(signal, 0, -1) == [b"1"]


# -- the primitives: a release with a waiter, and a waiter admitted, while the slot migrates -----


def queue_key(name: str, suffix: str) -> str:
    return f"{PREFIX}{{{name}}}:{suffix}"


def test_semaphore_waiter_admitted_while_the_slot_migrates(
    cluster: Cluster, client: redmutex.Client
) -> None:
    name = "sem-mig-admit"
    first = redmutex.Semaphore(client, name, 2, ttl=30)
    second = redmutex.Semaphore(client, name, 2, ttl=30)
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    waiter = redmutex.Semaphore(client, name, 2, ttl=30)
    waiting = ResultThread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    r = source_of(cluster, queue_key(name, "sem:queue"))
    wait_for("the waiter to queue", lambda: r.llen(queue_key(name, "sem:queue")) == 1)
    with migrating(cluster, slot_of(queue_key(name, "sem:holders"))):
        released_at = time.monotonic()
        second.release()
        # The woken waiter's acquire runs on the source (every key is there) and admits it.
        assert waiting.outcome(10) is True
        assert waiting.finished_at is not None and waiting.finished_at - released_at < 2.0
    holders = r.zrange(queue_key(name, "sem:holders"), 0, -1)
    assert sorted(holders) == sorted([first.token.encode(), waiter.token.encode()])  # type: ignore[union-attr]
    assert waiter.holders() == 2
    waiter.release()
    first.release()


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
def test_release_with_a_waiter_while_the_slot_migrates(
    cluster: Cluster, client: redmutex.Client, kind: str
) -> None:
    name = f"{kind}-mig-release"
    if kind == "semaphore":
        holder: Any = redmutex.Semaphore(client, name, 1, ttl=30)
        waiter: Any = redmutex.Semaphore(client, name, 1, ttl=30)
        queued = queue_key(name, "sem:queue")
    else:
        holder = redmutex.RWLock(client, name, ttl=30).read()
        waiter = redmutex.RWLock(client, name, ttl=30).write()
        queued = queue_key(name, "rw:writers_waiting")
    assert holder.acquire(blocking=False)
    waiting = ResultThread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    r = source_of(cluster, queued)
    wait_for("the waiter to queue", lambda: r.exists(queued) == 1)
    # What the release publishes on the name's wake channel(s), heard beside the waiter: a
    # lost wake-up would only cost the waiter until its place's refresh (2 s), too close to
    # time apart from a stalled machine, so it is checked here instead.
    wakes = r.pubsub()
    wakes.psubscribe(f"{PREFIX}{{{name}}}:wake*")
    assert wakes.get_message(timeout=10)["type"] == "psubscribe"  # type: ignore[index]
    try:
        with migrating(cluster, slot_of(queued)):
            released_at = time.monotonic()
            # The release empties the holders' key (the old scripts then touched it: LockError).
            holder.release()
            # The waiter's acquire finds a declared key missing and is told TRYAGAIN until the
            # slot is stable again: the migration is cancelled 0.3 s after the release.
            time.sleep(0.3)
        # The release published a wake-up while the slot migrated.
        woken = wakes.get_message(timeout=10)
        assert woken is not None and woken["type"] == "pmessage", woken
    finally:
        wakes.close()
    # Woken by the release (its lease has 30 s left), it gets in as soon as the slot is stable,
    # not when the lease ends.
    assert waiting.outcome(10) is True
    assert waiting.finished_at is not None and waiting.finished_at - released_at < 2.5
    waiter.release()


@pytest.mark.parametrize("kind", ["lock", "fair", "semaphore", "read"])
def test_a_waiter_gives_up_in_time_while_the_slot_migrates(
    cluster: Cluster, client: redmutex.Client, kind: str
) -> None:
    # The waiter's attempts declare a key that does not exist (its queue), which the source of
    # a migrating slot answers with TRYAGAIN; they were tried again until the command timeout
    # (5 s), past the acquire's own timeout. It must give up at its timeout: not acquired.
    name = f"{kind}-mig-timeout"
    holder: Any
    if kind == "semaphore":
        holder = redmutex.Semaphore(client, name, 1, ttl=30)
        waiter: Any = redmutex.Semaphore(client, name, 1, ttl=30)
    elif kind == "read":
        # another client's: this thread's read through the same client would raise
        holder = redmutex.RWLock(cluster.client(PREFIX), name, ttl=30).write()
        waiter = redmutex.RWLock(client, name, ttl=30).read()
    else:
        holder = redmutex.Lock(client, name, ttl=30, fair=kind == "fair")
        waiter = redmutex.Lock(client, name, ttl=30, fair=kind == "fair")
    assert holder.acquire(blocking=False)
    try:
        with migrating(cluster, slot_of(queue_key(name, "lock"))):
            for timeout in (0.5, 1.5):
                started = time.monotonic()
                assert waiter.acquire(timeout=timeout) is False
                took = time.monotonic() - started
                assert took < timeout + 1.5, f"gave up {took - timeout:.1f} s late"
            # A try-once gives up likewise, at once: it was tried again for the whole command
            # timeout, then raised ConnectionError.
            for once in ({"blocking": False}, {"timeout": 0}):
                started = time.monotonic()
                assert waiter.acquire(**once) is False
                took = time.monotonic() - started
                assert took < 1.5, f"{once}: gave up after {took:.1f} s"
    finally:
        holder.release()
    # Nothing of the waiter's is left: the holder's release leaves the name free.
    assert waiter.acquire(timeout=5) is True
    waiter.release()
