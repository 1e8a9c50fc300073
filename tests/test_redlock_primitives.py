"""Semaphore, RWLock and the cache on Redlock (`Client([url, ...])`): 5 masters, each behind a
loopback proxy that the tests cut (`FaultProxy.stop`: connections reset, reconnects refused)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redmutex
import redmutex.aio
from _proxy import FaultProxy
from _scale_servers import Masters, wait_for

pytestmark = pytest.mark.timeout(120)

FAST = {"connect_timeout": 1.0, "command_timeout": 1.0}


class Proxied:
    """5 masters, each reached through a proxy of its own."""

    def __init__(self, masters: Masters) -> None:
        self.masters = masters
        self.proxies = [FaultProxy(s.port).start() for s in masters.servers]

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    def cut(self, *indices: int) -> None:
        for i in indices:
            self.proxies[i].stop()

    def direct(self, index: int) -> redis.Redis:
        return self.masters.conn(index)

    def stop(self) -> None:
        for p in self.proxies:
            p.stop()


@pytest.fixture
def rl() -> Iterator[Proxied]:
    with Masters(5) as m:
        proxied = Proxied(m)
        try:
            yield proxied
        finally:
            proxied.stop()


def name() -> str:
    return "rlp-" + uuid.uuid4().hex[:12]


def client(rl: Proxied) -> redmutex.Client:
    return redmutex.Client(rl.urls, prefix="t:", **FAST)


def keys_left(rl: Proxied, indices: range | tuple[int, ...], n: str) -> list[bytes]:
    found: list[bytes] = []
    for i in indices:
        with rl.direct(i) as r:
            found += list(r.scan_iter(f"t:{{{n}}}*"))
    return found


def slots_of(rl: Proxied, indices: range, slots: str, token: str) -> set[int]:
    """The semaphore slots `token` holds on those masters; empty while one of them holds none."""
    found: set[int] = set()
    for i in indices:
        with rl.direct(i) as r:
            slot = r.hget(slots, f"t{token}")
        if slot is None:
            return set()
        found.add(int(slot))
    return found


def wait_empty(rl: Proxied, indices: range | tuple[int, ...], n: str) -> list[bytes]:
    """The keys of `n` on those masters, once none is left or 3 s have passed."""
    deadline = time.monotonic() + 3
    while keys_left(rl, indices, n) and time.monotonic() < deadline:
        time.sleep(0.05)
    return keys_left(rl, indices, n)


# ----------------------------------------------------------------------------- semaphore


def test_semaphore_basics(rl: Proxied) -> None:
    c, n = client(rl), name()
    a, b, x = (redmutex.Semaphore(c, n, 2, ttl=5) for _ in range(3))
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    assert not x.acquire(blocking=False)
    t0 = time.monotonic()
    assert not x.acquire(timeout=0.3)
    assert time.monotonic() - t0 < 2
    assert a.owned() and b.owned() and not x.owned()
    a.extend(10)
    assert 9 < (a.remaining() or 0) <= 10
    # A waiter is woken by a release (not by the 5 s lease end).
    threading.Timer(0.3, b.release).start()
    t0 = time.monotonic()
    assert x.acquire(timeout=4)
    assert time.monotonic() - t0 < 2
    a.release()
    x.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        x.release()
    # Released everywhere: nothing left behind on any master.
    assert wait_empty(rl, range(5), n) == []
    # A fair semaphore keeps no queue order by majority.
    with pytest.raises(NotImplementedError, match="fair.*Redlock"):
        redmutex.Semaphore(c, name(), 2, fair=True)


def test_semaphore_holders_of_overlapping_majorities_leave_no_room_for_a_third(
    rl: Proxied,
) -> None:
    # limit 2 on 5 masters: A holds on {0,1,2}, B on {2,3,4}. Per-master counting would let C
    # in on {0,1,3,4} (no master above 2 holders: 3 holders of a majority each); with slots A
    # and B hold different slots, each on a majority, and no slot is free on a majority.
    c, n = client(rl), name()
    a, b, x = (redmutex.Semaphore(c, n, 2, ttl=20) for _ in range(3))
    rl.proxies[3].blackhole()
    rl.proxies[4].blackhole()
    assert a.acquire(timeout=5)
    time.sleep(1.5)  # its votes into the black hole time out (1 s) before the heal
    rl.proxies[3].heal()
    rl.proxies[4].heal()
    rl.proxies[0].blackhole()
    rl.proxies[1].blackhole()
    assert b.acquire(timeout=10)
    time.sleep(1.5)
    rl.proxies[0].heal()
    rl.proxies[1].heal()
    time.sleep(0.3)
    on: list[set[str]] = []
    for i in range(5):
        with rl.direct(i) as r:
            on.append({t.decode() for t in r.zrange(f"t:{{{n}}}:sem:holders", 0, -1)})
    ta, tb = a.token, b.token
    assert on == [{ta}, {ta}, {ta, tb}, {tb}, {tb}], on  # counting would admit C on 0, 1, 3, 4
    assert not x.acquire(timeout=1)
    assert a.owned() and b.owned()
    a.release()
    assert x.acquire(timeout=5)
    b.release()
    x.release()


@pytest.mark.parametrize("then", ["extend", "release"])
def test_semaphore_hold_counts_only_masters_holding_its_own_slot(rl: Proxied, then: str) -> None:
    # A holds slot s on a majority. Then masters 0 and 1 hold A in the other slot instead (an
    # earlier round's grant whose give-back never landed, where the won round's vote never
    # arrived), and masters 2 and 3 lose A's copy (lapsed, or restarted): only master 4 holds
    # A's slot. Counting masters by token alone, A still held on 0, 1 and 4 while B took slot s
    # (free on 0-3) and C the other slot (free on 2-4): three holders of a limit-2 semaphore.
    c, n = client(rl), name()
    a, b, x = (redmutex.Semaphore(c, n, 2, ttl=20) for _ in range(3))
    assert a.acquire(timeout=5)
    ta = a.token
    holders, slots = f"t:{{{n}}}:sem:holders", f"t:{{{n}}}:sem:slots"
    # The acquire returns once a majority granted; the other votes land later and join the
    # hold. The scene below is set over all five grants: a vote landing after it would grant
    # A's slot again where the scene took it away (and leave master 4 without it until then).
    won = wait_for("A's slot on all five masters", lambda: slots_of(rl, range(5), slots, ta), 10)
    assert len(won) == 1, won
    (s,) = won
    other = 1 - s
    for i in (0, 1):
        with rl.direct(i) as r:
            r.hdel(slots, f"s{s}")
            r.hset(slots, mapping={f"s{other}": ta, f"t{ta}": other})
    for i in (2, 3):
        with rl.direct(i) as r:
            r.hdel(slots, f"s{s}", f"t{ta}")
            r.zrem(holders, ta)
    assert b.acquire(blocking=False) and x.acquire(blocking=False)
    assert not a.owned()
    with pytest.raises(redmutex.LockLostError):
        a.extend() if then == "extend" else a.release()
    b.release()
    x.release()


def test_semaphore_another_limit_is_refused(rl: Proxied) -> None:
    c, n = client(rl), name()
    a = redmutex.Semaphore(c, n, 2, ttl=5)
    assert a.acquire(blocking=False)
    with pytest.raises(redmutex.LockError, match="limit"):
        redmutex.Semaphore(c, n, 3, ttl=5).acquire(blocking=False)
    a.release()


WORKER = r"""
import random, sys, time
import redis, redmutex

urls, tally_port, name, kind = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rounds, seconds, limit = int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
client = redmutex.Client(urls, prefix="t:", connect_timeout=1, command_timeout=1)
tally = redis.Redis(port=tally_port)  # the test's counters, on a master reached directly
deadline = time.monotonic() + seconds
done = 0


def release(held):
    # A hold whose majority included a master cut at that moment may not be confirmed by a
    # majority any more (QuorumError): what is checked here is exclusion, counted above.
    try:
        held.release()
    except redmutex.LockError:
        tally.incr("release_errors")


if kind == "rw":
    rw = redmutex.RWLock(client, name, ttl=10)
for _ in range(rounds):
    if time.monotonic() > deadline:
        break
    if kind == "sem":
        held = redmutex.Semaphore(client, name, limit, ttl=10)
        if not held.acquire(timeout=5):
            continue
        if tally.incr("inside") > limit:
            tally.incr("overlaps")
        tally.incr("held")
        time.sleep(random.random() * 0.01)
        tally.decr("inside")
        release(held)
    else:
        writing = random.random() < 0.3
        held = rw.write() if writing else rw.read()
        if not held.acquire(timeout=5):
            continue
        if writing:
            if tally.incr("writers") > 1 or int(tally.get("readers") or 0) > 0:
                tally.incr("overlaps")
        else:
            tally.incr("readers")
            if int(tally.get("writers") or 0) > 0:
                tally.incr("overlaps")
        tally.incr("writes" if writing else "reads")
        time.sleep(random.random() * 0.005)
        tally.decr("writers" if writing else "readers")
        release(held)
    done += 1
print("done", done)
"""


def run_workers(rl: Proxied, kind: str, n: str, limit: int = 1) -> redis.Redis:
    """6 processes (bounded: 40 rounds or 12 s each); 2 masters cut 1 s into the run."""
    tally_port = rl.masters.servers[4].port
    args = [",".join(rl.urls), str(tally_port), n, kind, "40", "12", str(limit)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, *args]) for _ in range(6)]
    try:
        time.sleep(1.0)
        rl.cut(0, 1)
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return redis.Redis(port=tally_port)


def test_semaphore_never_more_than_limit_across_6_processes_with_2_masters_cut(
    rl: Proxied,
) -> None:
    n = name()
    with run_workers(rl, "sem", n, limit=2) as tally:
        assert int(tally.get("overlaps") or 0) == 0
        assert int(tally.get("held") or 0) >= 30  # it did run, also after the cut


# -------------------------------------------------------------------------------- RWLock


def test_rwlock_basics(rl: Proxied) -> None:
    c, n = client(rl), name()
    rw = redmutex.RWLock(client(rl), n, ttl=5)
    r1, r2 = rw.read(), rw.read()
    # Another client's RWLock: the deadlock guard covers one client's RWLock objects of a name.
    w = redmutex.RWLock(c, n, ttl=5).write()
    assert r1.acquire(blocking=False) and r2.acquire(blocking=False)
    assert not w.acquire(blocking=False)
    r1.release()
    threading.Timer(0.3, r2.release).start()
    t0 = time.monotonic()
    assert w.acquire(timeout=4)  # woken by the last reader's release
    assert time.monotonic() - t0 < 2
    assert w.owned()
    other = redmutex.RWLock(client(rl), n, ttl=5)
    assert not other.read().acquire(blocking=False)
    assert not other.write().acquire(blocking=False)
    w.extend(8)
    w.release()
    assert other.read().acquire(blocking=False)
    assert keys_left(rl, range(5), n) != []  # the reader still holds
    # The deadlock guard holds on Redlock too.
    with pytest.raises(redmutex.LockError, match="upgrade"):
        rw2 = redmutex.RWLock(c, name())
        with rw2.read():
            rw2.write().acquire(timeout=1)


def test_readers_and_writers_never_overlap_across_6_processes_with_2_masters_cut(
    rl: Proxied,
) -> None:
    n = name()
    with run_workers(rl, "rw", n) as tally:
        assert int(tally.get("overlaps") or 0) == 0
        assert int(tally.get("writes") or 0) >= 5
        assert int(tally.get("reads") or 0) >= 10


# ------------------------------------------------------------------------- quorum errors


def test_three_masters_cut_is_a_quorum_error_in_bound_and_leaves_nothing(rl: Proxied) -> None:
    c, n = client(rl), name()
    assert c.ping()
    rl.cut(0, 2, 4)
    rw = redmutex.RWLock(c, n)
    for acquire in (
        lambda: redmutex.Semaphore(c, n, 3).acquire(),
        lambda: redmutex.Semaphore(c, n, 3).acquire(blocking=False),
        lambda: rw.read().acquire(),
        lambda: rw.write().acquire(timeout=5),
    ):
        t0 = time.monotonic()
        with pytest.raises(redmutex.QuorumError, match="majority"):
            acquire()
        assert time.monotonic() - t0 < 1.0 + 0.8  # the connect timeout, never a hang
    # The grants on the two reachable masters were given back; a writer's mark taken back.
    assert wait_empty(rl, (1, 3), n) == []


# --------------------------------------------------------------------------------- cache

STAMPEDE = r"""
import sys, time, uuid, threading
import redis, redmutex

urls, tally_port, key = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
client = redmutex.Client(urls, prefix="t:", connect_timeout=1, command_timeout=1)
tally = redis.Redis(port=tally_port)
client.ping()
results = []

def fill():
    tally.incr(key + ":fills")
    time.sleep(0.3)
    return "value-" + uuid.uuid4().hex

def call():
    results.append(redmutex.get_or_fill(client, key, fill, ttl=60, timeout=20))

start_at = float(sys.argv[4])
time.sleep(max(0.0, start_at - time.time()))
threads = [threading.Thread(target=call) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(set(results)), results[0])
"""


def test_cache_one_fill_per_stampede_across_6_processes_with_2_masters_cut(
    rl: Proxied,
) -> None:
    tally_port = rl.masters.servers[4].port
    rl.cut(0, 1)
    values = set()
    for stampede in range(3):  # bounded: 3 stampedes of 6 processes x 4 threads
        key = f"{name()}-{stampede}"
        start_at = f"{time.time() + 1.5:.3f}"
        args = [",".join(rl.urls), str(tally_port), key, start_at]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", STAMPEDE, *args], stdout=subprocess.PIPE, text=True
            )
            for _ in range(6)
        ]
        try:
            outs = [p.communicate(timeout=60)[0].split() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert all(p.returncode == 0 for p in procs)
        assert {o[0] for o in outs} == {"1"} and len({o[1] for o in outs}) == 1, outs
        values.add(outs[0][1])
        with redis.Redis(port=tally_port) as tally:
            assert int(tally.get(key + ":fills") or 0) == 1
    assert len(values) == 3


def test_a_fill_asking_for_its_own_entry_through_other_urls_of_the_masters_raises(
    rl: Proxied,
) -> None:
    # The masters through their proxies and directly: other URLs, the same entry. The fill
    # waited for its own claim (held on a majority, renewed while it waited).
    outer, inner = client(rl), redmutex.Client(rl.masters.urls, prefix="t:", **FAST)
    n = name()

    def fill() -> str:
        return redmutex.get_or_fill(inner, n, lambda: "inner", ttl=30, timeout=3)

    with pytest.raises(RuntimeError, match="its own fill"):
        redmutex.get_or_fill(outer, n, fill, ttl=30)
    assert wait_empty(rl, range(5), n) == []
    # Another prefix there is another entry.
    other = redmutex.Client(rl.masters.urls, prefix="u:", **FAST)
    assert (
        redmutex.get_or_fill(
            outer, n, lambda: redmutex.get_or_fill(other, n, lambda: 1, ttl=30), ttl=30
        )
        == 1
    )


def test_cache_basics_invalidate_and_quorum_error(rl: Proxied) -> None:
    c, n = client(rl), name()
    fills: list[int] = []

    def fill() -> int:
        fills.append(1)
        return len(fills)

    assert redmutex.get_or_fill(c, n, fill, ttl=30) == 1
    assert redmutex.get_or_fill(c, n, fill, ttl=30) == 1
    assert len(fills) == 1
    # Stored on every master (the store returns on a majority; the rest land in the background,
    # and must have before two copies are deleted below); a minority's value is never served.
    value_key = f"t:{{{n}}}:value".encode()
    wait_for(
        "the value on all five masters",
        lambda: keys_left(rl, range(5), n).count(value_key) == 5,
        10,
    )
    rl.cut(0)
    assert redmutex.get_or_fill(client(rl), n, fill, ttl=30) == 1
    with rl.direct(2) as r2, rl.direct(3) as r3:
        for r in (r2, r3):
            r.delete(f"t:{{{n}}}:value")
    assert redmutex.get_or_fill(c, n, fill, ttl=30) == 2  # 2 of 4 reachable copies: refilled

    @redmutex.cached(c, ttl=30)
    def cached(x: int) -> int:
        return fill() * 0 + x

    assert cached(5) == 5 and cached(5) == 5
    cached.invalidate(5)
    before = len(fills)
    assert cached(5) == 5 and len(fills) == before + 1
    # 3 masters cut: QuorumError within the connect timeout, no fill, nothing left behind.
    rl.cut(2, 4)
    other = name()
    t0 = time.monotonic()
    with pytest.raises(redmutex.QuorumError, match="majority"):
        redmutex.get_or_fill(c, other, fill, ttl=30)
    assert time.monotonic() - t0 < 1.8
    assert len(fills) == before + 1
    assert wait_empty(rl, (1, 3), other) == []


# ---------------------------------------------------------------------------------- aio


def test_asyncio_semaphore_rwlock_and_cache(rl: Proxied) -> None:
    async def main() -> None:
        c, n = client(rl), name()
        sem = redmutex.aio.Semaphore(c, n, 1, ttl=5)
        other = redmutex.aio.Semaphore(c, n, 1, ttl=5)
        assert await sem.acquire()
        waiter = asyncio.ensure_future(other.acquire(timeout=4))
        await asyncio.sleep(0.2)
        await sem.release()
        assert await waiter
        await other.release()
        rw = redmutex.aio.RWLock(c, n + "rw", ttl=5)
        async with rw.read():
            other = redmutex.aio.RWLock(client(rl), n + "rw", ttl=5)  # another client's
            assert not await other.write().acquire(blocking=False)
        async with rw.write():
            pass
        assert wait_empty(rl, range(5), n) == []
        fills: list[int] = []

        async def fill() -> int:
            fills.append(1)
            await asyncio.sleep(0.2)
            return len(fills)

        key = n + "cache"
        got = await asyncio.gather(
            *(redmutex.aio.get_or_fill(c, key, fill, ttl=30) for _ in range(8))
        )
        assert got == [1] * 8 and fills == [1]

    asyncio.run(main())
