"""The acquire scripts and their fence (src/protocol/lua/fence_next.lua): fence = max(counter + 1,
server time in µs) on every acquisition, the counter's expiry refreshed to `fence_ttl`, whatever
state a failover or an expiry left the counter in. On Redis >= 7.0 the scripts read and write a
key in one `SET ... GET` call; older servers take the read-then-write path, which is run here by
hiding the server's version from the scripts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redmutex
from redmutex._core import _script_source
from redmutex._server import RedisServer

LUA = Path(__file__).resolve().parents[1] / "src" / "protocol" / "lua"

# Run before a script, hides `redis.REDIS_VERSION_NUM` (set by Redis >= 7.0) from it: the scripts
# then take the path of older servers.
AS_BEFORE_7 = (
    "local redis = setmetatable({}, {__index = function(_, k)\n"
    "  if k == 'REDIS_VERSION_NUM' then return nil end\n"
    "  return redis[k]\n"
    "end})\n"
)


# The scripts as the Rust core sends them (their preludes included).
UNFAIR = _script_source("lock_acquire")
FAIR = _script_source("lock_acquire_fair")


def _server_us(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1_000_000 + int(micros)


def _version(r: redis.Redis) -> tuple[int, ...]:
    return tuple(int(x) for x in str(r.info("server")["redis_version"]).split(".")[:2])


class Keys:
    def __init__(self, prefix: str, name: str) -> None:
        base = f"{prefix}{{{name}}}"
        self.lock, self.fence = base + ":lock", base + ":fence"
        self.queue = base + ":lock:queue"
        self.wake = base + ":wake"


Acquire = Callable[..., Any]


def _in_line(r: redis.Redis, k: Keys) -> list[bytes]:
    """The queued tokens in turn: by their records, which open with the place's seq."""
    places: dict[bytes, bytes] = r.hgetall(k.queue)  # type: ignore[assignment]
    return [token for token, _ in sorted(places.items(), key=lambda item: item[1])]


def _fence(reply: Any) -> int:
    """The fence of a granted attempt: the scripts reply with it alone (a busy reply is a list)."""
    assert isinstance(reply, int), reply
    return reply


def _scripts(r: redis.Redis, before_7: bool) -> tuple[Acquire, Acquire]:
    """The unfair and the fair acquire, as the Rust core sends them (fence ttl 5 s)."""
    head = AS_BEFORE_7 if before_7 else ""
    unfair, fair = r.register_script(head + UNFAIR), r.register_script(head + FAIR)

    def acquire(k: Keys, token: str, lease_ms: int = 10_000, first: bool = False) -> Any:
        args: list[str | int] = [token, lease_ms, 5000] + (["first"] if first else [])
        return unfair(keys=[k.lock, k.fence], args=args)

    def acquire_fair(k: Keys, token: str, lease_ms: int = 10_000, join: bool = True) -> Any:
        keys = [k.lock, k.fence, k.queue]
        args = [token, lease_ms, 10_000, "1" if join else "0", "", 5000, k.wake]
        return fair(keys=keys, args=args)

    return acquire, acquire_fair


def test_the_gate_follows_the_servers_version(r: redis.Redis) -> None:
    gate = (LUA / "fence_next.lua").read_text() + "return set_get and 1 or 0"
    assert r.eval(AS_BEFORE_7 + gate, 0) == 0
    assert r.eval(gate, 0) == (1 if _version(r) >= (7, 0) else 0)


@pytest.mark.parametrize("before_7", [False, True], ids=["redis7", "before7"])
@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_every_state_of_the_counter_gives_a_larger_fence(
    r: redis.Redis, prefix: str, fair: bool, before_7: bool
) -> None:
    unfair_acquire, fair_acquire = _scripts(r, before_7)
    acquire = fair_acquire if fair else unfair_acquire
    k = Keys(prefix, "states")

    # No counter (never used, or expired): the clock.
    before = _server_us(r)
    fence = _fence(acquire(k, "a"))
    assert before <= fence <= _server_us(r)
    assert int(r.get(k.fence) or 0) == fence
    assert 1000 < r.pttl(k.fence) <= 5000
    assert 1000 < r.pttl(k.lock) <= 10_000 and r.get(k.lock) == b"a"
    r.delete(k.lock)

    # A counter that a failover set back (writes lost with the old master): the clock again.
    r.set(k.fence, 5, px=1000)
    before = _server_us(r)
    fence = _fence(acquire(k, "b"))
    assert before <= fence <= _server_us(r)
    assert int(r.get(k.fence) or 0) == fence and r.pttl(k.fence) > 1000
    r.delete(k.lock)

    # A counter ahead of the clock (the clock stepped back): counted on from there.
    ahead = _server_us(r) + 10**12
    r.set(k.fence, ahead, px=1000)
    assert acquire(k, "c") == ahead + 1
    assert int(r.get(k.fence) or 0) == ahead + 1 and r.pttl(k.fence) > 1000
    r.delete(k.lock)

    # A counter that is no number: the clock (as if there were none).
    r.set(k.fence, "junk")
    before = _server_us(r)
    fence = _fence(acquire(k, "d"))
    assert before <= fence <= _server_us(r)
    assert int(r.get(k.fence) or 0) == fence
    r.delete(k.lock, k.fence)


@pytest.mark.parametrize("before_7", [False, True], ids=["redis7", "before7"])
def test_the_unfair_acquire_replies_with_the_fence_or_the_lease_left(
    r: redis.Redis, prefix: str, before_7: bool
) -> None:
    acquire, _ = _scripts(r, before_7)
    k = Keys(prefix, "unfair")
    fence = _fence(acquire(k, "a", lease_ms=8000))
    # A resend that finds its own token: granted, the same fence, the lease renewed from now
    # (the token may be an earlier attempt's, e.g. a lost Redlock round's that was not given
    # back: its lease would end before the one the caller counts on).
    assert acquire(k, "a", lease_ms=60_000) == fence
    assert 50_000 < r.pttl(k.lock) <= 60_000
    # The first send of a chosen token found in place: another call's hold.
    busy, pttl = acquire(k, "a", first=True)
    assert busy == 0 and 8000 < pttl <= 60_000
    busy, pttl = acquire(k, "b")
    assert busy == 0 and 8000 < pttl <= 60_000
    assert r.get(k.lock) == b"a" and int(r.get(k.fence) or 0) == fence
    # Held without a lease (written by hand): -1, and nothing is changed.
    r.set(k.lock, "x")
    assert acquire(k, "b") == [0, -1]
    assert r.get(k.lock) == b"x" and r.ttl(k.lock) == -1
    r.delete(k.lock)
    assert _fence(acquire(k, "b")) > fence


@pytest.mark.parametrize("before_7", [False, True], ids=["redis7", "before7"])
def test_the_fair_acquire_keeps_the_queue_order(
    r: redis.Redis, prefix: str, before_7: bool
) -> None:
    _, acquire = _scripts(r, before_7)
    k = Keys(prefix, "fair")
    fence = _fence(acquire(k, "a"))
    # Its own token again: granted, the same fence, the lease renewed.
    r.pexpire(k.lock, 1000)
    assert acquire(k, "a") == fence
    assert r.pttl(k.lock) > 1000
    # Busy: b and c queue in order, d only tries.
    for token in ("b", "c"):
        busy, ms, seen = acquire(k, token)
        assert busy == 0 and 0 < ms <= 10_000 and int(seen) == fence
    busy, _, _ = acquire(k, "d", join=False)
    assert busy == 0
    assert _in_line(r, k) == [b"b", b"c"]
    r.delete(k.lock)
    # Free, but b is first: c waits for b's place (not longer than it lasts), d is refused.
    busy, ms, seen = acquire(k, "c")
    assert busy == 0 and 0 < ms <= 10_000 and int(seen) == fence
    assert acquire(k, "d", join=False)[0] == 0
    fence_b = _fence(acquire(k, "b"))
    assert fence_b > fence
    assert _in_line(r, k) == [b"c"]
    r.delete(k.lock)
    # c stops refreshing its place and it lapses: it is pruned, and d, trying once, is granted.
    # (its record's deadline, the second field, passed: see waitlist.lua)
    seq, _, lease, inbox = r.hget(k.queue, "c").split(b" ")  # type: ignore[union-attr]
    r.hset(k.queue, "c", b" ".join([seq, b"1", lease, inbox]))
    fence_d = _fence(acquire(k, "d", join=False))
    assert fence_d > fence_b
    assert r.exists(k.queue) == 0


def _commands(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_an_uncontended_acquire_reads_and_writes_in_one_call_on_redis_7(
    make_server: Callable[..., RedisServer], fair: bool
) -> None:
    server = make_server()
    r = redis.Redis.from_url(server.url)
    if _version(r) < (7, 0):
        pytest.skip("SET ... NX GET needs Redis >= 7.0")
    with redmutex.Client(server.url) as client:
        lock = redmutex.Lock(client, "calls", fair=fair)
        with lock:
            pass
        before = _commands(r)
        assert lock.acquire()
        after = _commands(r)
        lock.release()
    ran = {name: after[name] - before.get(name, 0) for name in after}
    ran = {name: n for name, n in ran.items() if n and name != "info"}
    # The lock taken (SET NX GET), the clock read (TIME), the counter swapped (SET GET).
    expected = {"evalsha": 1, "set": 2, "time": 1}
    if fair:
        expected["hgetall"] = 1  # nobody queued: nothing to drop
    assert ran == expected
    r.close()
