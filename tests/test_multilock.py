"""MultiLock: several lock names held together, all or none, on one server and on a Cluster."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from _helpers import ResultThread, wait_until, wake_delay
from _scale_servers import Cluster
from redis.crc import key_slot
from redmutex import aio

pytestmark = pytest.mark.timeout(120)

KeyOf = Callable[[str, str], bytes]


# ------------------------------------------------------------------------------ arguments


def test_arguments(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="names"):
        redmutex.MultiLock(client, [])
    with pytest.raises(TypeError, match="names"):
        redmutex.MultiLock(client, "ab")
    with pytest.raises(TypeError, match="names"):
        redmutex.MultiLock(client, b"ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="names"):
        redmutex.MultiLock(client, ["a", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="names"):
        redmutex.MultiLock(client, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="names"):
        redmutex.MultiLock(client, ["a", ""])
    with pytest.raises(TypeError, match="ttl"):
        redmutex.MultiLock(client, ["a"], ttl=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        redmutex.MultiLock(client, ["a"], timeout=-1)
    # A name given twice counts once; the order given is kept; any iterable of str works.
    multi = redmutex.MultiLock(client, iter(["b", "a", "b"]))
    assert multi.names == ("b", "a")
    assert multi.fences is None and multi.token is None and not multi.lost
    assert "MultiLock(['b', 'a']" in repr(multi)
    with multi:
        assert multi.fences is not None and set(multi.fences) == {"a", "b"}
    with pytest.raises(redmutex.LockNotOwnedError):
        multi.release()


# ------------------------------------------------------------------------------ one server


def test_all_or_none(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    single = redmutex.Lock(client, "b", ttl=10)
    assert single.acquire()
    multi = redmutex.MultiLock(client, ["a", "b", "c"], ttl=10)
    assert multi.acquire(blocking=False) is False
    # Nothing of it was taken: a and c are untouched, b is still the Lock's.
    assert r.get(key_of("a", "lock")) is None and r.get(key_of("c", "lock")) is None
    assert r.get(key_of("b", "lock")) == single.token.encode()  # type: ignore[union-attr]
    assert multi.token is None and multi.fences is None
    single.release()
    assert multi.acquire(blocking=False)
    token = multi.token
    assert token is not None
    for n in "abc":
        assert r.get(key_of(n, "lock")) == token.encode()
        assert 9000 < r.pttl(key_of(n, "lock")) <= 10000
    assert multi.owned()
    with pytest.raises(redmutex.LockError):
        multi.acquire(blocking=False)
    multi.release()
    # Nothing remains but the fence counters.
    for n in "abc":
        assert r.get(key_of(n, "lock")) is None
        assert r.exists(key_of(n, "fence"))
    assert not multi.owned()


def test_exclusion_against_single_locks_both_ways(client: redmutex.Client) -> None:
    multi = redmutex.MultiLock(client, ["x", "y"], ttl=10)
    with multi:
        assert redmutex.Lock(client, "x").acquire(blocking=False) is False
        assert redmutex.Lock(client, "y").acquire(blocking=False) is False
        assert redmutex.Lock(client, "x", fair=True).acquire(blocking=False) is False
        assert redmutex.MultiLock(client, ["y", "z"]).acquire(blocking=False) is False
        free = redmutex.Lock(client, "z")
        assert free.acquire(blocking=False)
        free.release()
        assert redmutex.Lock(client, "x").locked()
    one = redmutex.Lock(client, "x")
    assert one.acquire(blocking=False)
    one.release()


def test_fences_per_name_increase_with_the_lock_fences(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "f1")
    with lock:
        before = lock.fence
    assert before is not None
    multi = redmutex.MultiLock(client, ["f1", "f2"])
    with multi:
        first = multi.fences
    assert first is not None and first["f1"] > before
    with multi:
        second = multi.fences
    assert second is not None
    assert second["f1"] > first["f1"] and second["f2"] > first["f2"]
    with lock:
        assert lock.fence is not None and lock.fence > second["f1"]


def test_a_waiter_is_woken_by_a_release_not_by_polling(client: redmutex.Client) -> None:
    # The holders' leases are long: only a wake-up gets the waiter in promptly.
    holder = redmutex.Lock(client, "w2", ttl=30)
    assert holder.acquire()
    waiter = redmutex.MultiLock(client, ["w1", "w2", "w3"], ttl=30)
    delay = wake_delay(holder.release, lambda: waiter.acquire(timeout=20), waiter.release)
    assert delay < 2.5, delay  # not at the 30 s lease end

    # And the other way: a Lock waiter is woken by the MultiLock's release.
    multi = redmutex.MultiLock(client, ["w1", "w2"], ttl=30)
    assert multi.acquire()
    lock = redmutex.Lock(client, "w2", ttl=30)
    delay = wake_delay(multi.release, lambda: lock.acquire(timeout=20), lock.release)
    assert delay < 2.5, delay  # not at the 30 s lease end


def test_a_timeout_leaves_nothing_held(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    holder = redmutex.Lock(client, "t3", ttl=10)
    assert holder.acquire()
    multi = redmutex.MultiLock(client, ["t1", "t2", "t3", "t4"], timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(redmutex.LockTimeoutError, match="multilock"), multi:
        pytest.fail("entered without the locks")
    assert 0.25 < time.monotonic() - t0 < 3
    assert multi.acquire(timeout=0.2) is False
    for n in ("t1", "t2", "t4"):
        assert r.get(key_of(n, "lock")) is None
    holder.release()


def test_a_fair_queue_counts_as_busy_and_is_served_on_release(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    multi = redmutex.MultiLock(client, ["q1", "q2"], ttl=10)
    # A live waiter in q1's fair queue (its place lasts 5 s): a MultiLock does not jump it.
    # (A place's record: '<seq> <place deadline ms> <lease ms> <inbox>', seq the server's clock
    # in µs when the place was taken: src/protocol/lua/waitlist.lua.)
    now_ms = int(r.time()[0]) * 1000
    places = key_of("q1", "lock:queue")
    r.hset(places, "someone", f"{now_ms * 1000} {now_ms + 5000} 10000 ab12")
    assert multi.acquire(blocking=False) is False
    r.hdel(places, "someone")
    # A lapsed place does not count.
    r.hset(places, "gone", f"{now_ms * 1000 - 9000000} {now_ms - 5000} 10000 ab12")
    assert multi.acquire(blocking=False)
    # A fair Lock waiting behind the MultiLock is granted the name on its release, at once:
    # the release itself hands the lock to the waiter and tells its inbox (without that, the
    # waiter would only find the lock free at its next look, its place's refresh 2 s later).
    fair = redmutex.Lock(client, "q1", ttl=10, fair=True)
    waiter = ResultThread(lambda: fair.acquire(timeout=20))
    waiter.start()

    def queued() -> list[bytes]:
        return [t for t in r.hkeys(places) if t != b"gone"]

    wait_until(lambda: len(queued()) == 1, 20, "the fair waiter to queue")
    token = queued()[0]
    inbox = r.hget(places, token).split()[-1].decode()  # type: ignore[union-attr]
    grants = r.pubsub()
    try:
        grants.subscribe(key_of("q1", "wake" + (":" + inbox if inbox else "")))
        assert grants.get_message(timeout=10)["type"] == "subscribe"  # type: ignore[index]
        multi.release()
        assert r.get(key_of("q1", "lock")) == token  # granted by the release
        told = grants.get_message(timeout=10)
        assert told is not None and told["data"].split()[0] == token, told
    finally:
        grants.close()
    assert waiter.outcome(20) is True
    fair.release()


def test_extend_owned_and_loss(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    multi = redmutex.MultiLock(client, ["e1", "e2"], ttl=2)
    assert multi.acquire()
    multi.extend(30)
    for n in ("e1", "e2"):
        assert r.pttl(key_of(n, "lock")) > 20000
    remaining = multi.remaining()
    assert remaining is not None and remaining > 20
    # Another owner takes e1 (say the lease had ended): the hold is lost; release still frees e2.
    r.set(key_of("e1", "lock"), b"other")
    assert multi.owned() is False
    with pytest.raises(redmutex.LockLostError):
        multi.extend()
    assert multi.lost
    with pytest.raises(redmutex.LockLostError):
        multi.release()
    assert r.get(key_of("e2", "lock")) is None
    assert r.get(key_of("e1", "lock")) == b"other"
    r.delete(key_of("e1", "lock"))
    # The object can be used again.
    with multi:
        assert multi.owned() and not multi.lost


def test_auto_renew_renews_every_name(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    lost: list[redmutex.MultiLock] = []
    multi = redmutex.MultiLock(client, ["r1", "r2"], ttl=1.5, auto_renew=True, on_lost=lost.append)
    assert multi.acquire()
    time.sleep(4.6)  # more than three leases
    assert multi.owned() and not multi.lost
    for n in ("r1", "r2"):
        assert r.pttl(key_of(n, "lock")) > 0
    # A name taken away is noticed by renewal, once.
    r.set(key_of("r2", "lock"), b"other", px=5000)
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost == [multi] and multi.lost
    with pytest.raises(redmutex.LockLostError):
        multi.release()
    assert r.get(key_of("r1", "lock")) is None


def crossing_stress(client: redmutex.Client, sets: list[list[str]], seconds: float) -> list[int]:
    """Threads, each taking its own set of names over and over (in crossing orders) for
    `seconds` (at most 400 rounds each), checking that no name is held twice at once. Returns
    the rounds each thread completed; a deadlock would leave a thread stuck past its timeout."""
    inside: dict[str, int] = {}
    guard = threading.Lock()
    errors: list[BaseException] = []
    rounds = [0] * len(sets)
    stop_at = time.monotonic() + seconds

    def work(i: int, names: list[str]) -> None:
        try:
            multi = redmutex.MultiLock(client, names, ttl=10, timeout=30)
            while time.monotonic() < stop_at and rounds[i] < 400:
                with multi:
                    with guard:
                        for n in names:
                            inside[n] = inside.get(n, 0) + 1
                            assert inside[n] == 1, f"{n} held twice"
                    with guard:
                        for n in names:
                            inside[n] -= 1
                rounds[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(sets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert not errors, errors
    return rounds


def test_no_deadlock_under_crossing_orders(client: redmutex.Client) -> None:
    sets = [["a", "b"], ["b", "a"], ["a", "b", "c"], ["c", "b"], ["b", "a"], ["c", "a"]]
    rounds = crossing_stress(client, sets, 3.0)
    assert all(n > 0 for n in rounds), rounds


def test_asyncio(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    async def main() -> None:
        multi = aio.MultiLock(client, ["m1", "m2"], ttl=10)
        async with multi:
            assert multi.names == ("m1", "m2")
            fences = multi.fences
            assert fences is not None and set(fences) == {"m1", "m2"}
            assert await multi.owned()
            other = aio.Lock(client, "m2", ttl=10)
            assert await other.acquire(blocking=False) is False
            waiting = asyncio.ensure_future(other.acquire(timeout=10))
            await asyncio.sleep(0.2)
            assert not waiting.done()
        assert await waiting
        # A waiting MultiLock that is cancelled takes nothing, now or later.
        blocked = aio.MultiLock(client, ["m1", "m2"], ttl=10)
        task = asyncio.ensure_future(blocked.acquire())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await other.release()
        await asyncio.sleep(0.3)
        assert r.get(key_of("m1", "lock")) is None and r.get(key_of("m2", "lock")) is None
        assert blocked.token is None
        async with aio.MultiLock(client, ["m2", "m1"], timeout=5) as again:
            assert await again.owned()
            await again.extend(5)

    asyncio.run(main())


# --------------------------------------------------------------------------- Redis Cluster

CPREFIX = "ml:"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(3) as c:
        yield c


@pytest.fixture(scope="module")
def cclient(cluster: Cluster) -> redmutex.Client:
    return redmutex.Client(
        cluster=cluster.urls, prefix=CPREFIX, connect_timeout=2.0, command_timeout=5.0
    )


def ckey(name: str, suffix: str = "lock") -> bytes:
    return f"{CPREFIX}{{{name}}}:{suffix}".encode()


def name_on(cluster: Cluster, index: int, tag: str) -> str:
    """A name whose slot belongs to node `index`."""
    server = cluster.servers[index]
    for i in range(100_000):
        candidate = f"{tag}{i}"
        if cluster.owner(int(key_slot(ckey(candidate)))) is server:
            return candidate
    raise LookupError


def cget(cluster: Cluster, name: str) -> bytes | None:
    owner = cluster.owner(int(key_slot(ckey(name))))
    with cluster.conn(owner) as conn:
        value: bytes | None = conn.get(ckey(name))
        return value


def test_cluster_all_or_none_and_exclusion(cluster: Cluster, cclient: redmutex.Client) -> None:
    a, b, c = (name_on(cluster, i, f"n{i}-") for i in range(3))
    # The names are on three nodes; whichever of them a Lock holds, the MultiLock takes none.
    for blocked in (a, b, c):
        single = redmutex.Lock(cclient, blocked, ttl=10)
        assert single.acquire()
        multi = redmutex.MultiLock(cclient, [c, a, b], ttl=10)
        assert multi.acquire(blocking=False) is False
        assert multi.acquire(timeout=0.3) is False
        for n in (a, b, c):
            expected = single.token.encode() if n == blocked else None  # type: ignore[union-attr]
            assert cget(cluster, n) == expected, n
        single.release()
    multi = redmutex.MultiLock(cclient, [c, a, b], ttl=10)
    with multi:
        assert multi.owned()
        for n in (a, b, c):
            assert cget(cluster, n) == multi.token.encode()  # type: ignore[union-attr]
            assert redmutex.Lock(cclient, n).acquire(blocking=False) is False
        fences = multi.fences
        assert fences is not None and set(fences) == {a, b, c}
        multi.extend(20)
        assert (multi.remaining() or 0) > 15
    for n in (a, b, c):
        assert cget(cluster, n) is None
    with multi:
        assert multi.fences is not None and all(multi.fences[n] > fences[n] for n in (a, b, c))


def test_cluster_woken_waiting_and_timeout_gives_back(
    cluster: Cluster, cclient: redmutex.Client
) -> None:
    a, b, c = (name_on(cluster, i, f"w{i}-") for i in range(3))
    first, last = min(a, b, c), max(a, b, c)
    # The last name in the global order is held: a waiter takes the others and waits for it.
    holder = redmutex.Lock(cclient, last, ttl=30)
    assert holder.acquire()
    multi = redmutex.MultiLock(cclient, [a, b, c], ttl=30)
    assert multi.acquire(timeout=0.5) is False
    # It gave back what it took while it waited.
    assert cget(cluster, first) is None
    waiter = redmutex.MultiLock(cclient, [a, b, c], ttl=30)
    delay = wake_delay(
        holder.release, lambda: waiter.acquire(timeout=20), waiter.release, settle=0.5, timeout=25
    )
    assert delay < 1.0, delay
    for n in (a, b, c):
        assert cget(cluster, n) is None


def test_cluster_keeps_the_names_it_waits_with_alive(
    cluster: Cluster, cclient: redmutex.Client
) -> None:
    a, b = sorted(name_on(cluster, i, f"k{i}-") for i in range(2))
    holder = redmutex.Lock(cclient, b, ttl=2.0)
    assert holder.acquire()
    got: list[bool] = []
    waiter = redmutex.MultiLock(cclient, [a, b], ttl=0.6)

    def wait() -> None:
        got.append(waiter.acquire(timeout=10))

    t = threading.Thread(target=wait)
    t.start()
    # Once the waiter took `a` (its thread may start late on a loaded machine), it holds it while
    # it waits for `b`, for longer than its 0.6 s lease: renewed.
    deadline = time.monotonic() + 10
    while cget(cluster, a) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    deadline = time.monotonic() + 1.5
    seen = set()
    while time.monotonic() < deadline:
        seen.add(cget(cluster, a))
        time.sleep(0.05)
    assert None not in seen and len(seen) == 1
    assert redmutex.Lock(cclient, a).acquire(blocking=False) is False
    holder.release()
    t.join(15)
    assert got == [True]
    waiter.release()


def test_cluster_no_deadlock_under_crossing_orders(
    cluster: Cluster, cclient: redmutex.Client
) -> None:
    a, b, c = (name_on(cluster, i, f"x{i}-") for i in range(3))
    sets = [[a, b], [b, a], [a, b, c], [c, b], [b, a], [c, a]]
    rounds = crossing_stress(cclient, sets, 3.0)
    assert all(n > 0 for n in rounds), rounds


def test_cluster_auto_renew_and_asyncio(cluster: Cluster, cclient: redmutex.Client) -> None:
    a, b = (name_on(cluster, i, f"r{i}-") for i in range(2))
    multi = redmutex.MultiLock(cclient, [a, b], ttl=1.5, auto_renew=True)
    with multi:
        time.sleep(4.6)  # more than three leases
        assert multi.owned() and not multi.lost

    async def main() -> None:
        held = aio.MultiLock(cclient, [b, a], ttl=10)
        async with held:
            other = aio.MultiLock(cclient, [a, b], ttl=10)
            waiting = asyncio.ensure_future(other.acquire(timeout=10))
            await asyncio.sleep(0.3)
            assert not waiting.done()
        assert await waiting
        assert await other.owned()
        await other.release()

    asyncio.run(main())
    assert cget(cluster, a) is None and cget(cluster, b) is None


def test_cli_shows_multi_holds(redis_url: str, client: redmutex.Client, prefix: str) -> None:
    import json
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "redmutex", *args, "--redis", redis_url, "--prefix", prefix],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )

    multi = redmutex.MultiLock(client, ["acct:1", "acct:2", "acct:3"], ttl=30)
    single = redmutex.Lock(client, "acct:9", ttl=30)
    with multi, single:
        done = cli("list", "--json")
        assert done.returncode == 0, done.stderr
        rows = {row["name"]: row for row in json.loads(done.stdout)}
        assert rows["acct:1"]["multi"] == ["acct:2", "acct:3"]
        assert rows["acct:3"]["multi"] == ["acct:1", "acct:2"]
        assert "multi" not in rows["acct:9"]
        text = cli("list").stdout
        assert text.count("multi-hold of 3 names") == 3, text
        done = cli("status", "acct:2", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["multi"] == ["acct:1", "acct:3"]
        assert (
            "held together with 2 other name(s): acct:1, acct:3" in cli("status", "acct:2").stdout
        )
        done = cli("status", "acct:9", "--json")
        assert json.loads(done.stdout)["multi"] is None


def test_errors_list_the_names_and_have_no_single_name(client: redmutex.Client) -> None:
    multi = redmutex.MultiLock(client, ["err-a", "err-b"])
    with pytest.raises(redmutex.LockNotOwnedError) as caught:
        multi.release()
    assert "err-a" in str(caught.value) and "err-b" in str(caught.value)
    assert caught.value.name is None  # several names: none of them is *the* name
    busy = redmutex.MultiLock(client, ["err-a", "err-b"], timeout=0)
    with redmutex.Lock(client, "err-b"), pytest.raises(redmutex.LockTimeoutError) as timed_out:
        busy.__enter__()
    assert "err-a" in str(timed_out.value) and timed_out.value.name is None
