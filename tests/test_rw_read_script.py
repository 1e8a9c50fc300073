"""The read side's acquire script of the read-write lock (src/protocol/lua/rw_read_acquire.lua),
run as the Rust core sends it, on Redis >= 7.0 (PEXPIRE NX/GT) and on the path of older servers
(the version hidden from the script). Issue 18 item 2 cut its work when nobody writes: one
EXISTS looks at the writer and the waiting writers, and the readers' key follows its longest
lease without being read back. These tests pin both that and what must not change: the key
lives at least as long as its longest lease, ended leases are dropped, a writer or a waiting
writer keeps new readers out, and a granted retry or a read-holder re-entering gets in."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redmutex._core import _script_source
from test_fence_script import AS_BEFORE_7

# The read acquire as the Rust core sends it (its preludes included).
READ = _script_source("rw_read_acquire")


def _now_ms(r: redis.Redis) -> int:
    """The server's clock in ms (the scripts' own)."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


Read = Callable[..., Any]


@pytest.fixture(params=[False, True], ids=["redis7", "before7"])
def read(request: pytest.FixtureRequest, r: redis.Redis, prefix: str) -> tuple[Read, list[str]]:
    script = r.register_script((AS_BEFORE_7 if request.param else "") + READ)
    keys = [f"{prefix}{{rw}}:readers", f"{prefix}{{rw}}:writer", f"{prefix}{{rw}}:waiting"]

    def acquire(token: str, lease_ms: int = 10_000, reentrant: bool = False) -> Any:
        args: list[str | int] = [token, lease_ms, "1" if reentrant else "0"]
        return script(keys=keys, args=args)  # type: ignore[no-any-return]

    return acquire, keys


def test_the_key_follows_its_longest_lease_and_drops_ended_ones(
    read: tuple[Read, list[str]], r: redis.Redis
) -> None:
    acquire, (readers, _, _) = read
    assert acquire("short", 150) == 1
    assert 0 < r.pttl(readers) <= 150
    assert acquire("long", 30_000) == 2
    assert 29_000 < r.pttl(readers) <= 30_000
    assert acquire("middle", 10_000) == 3
    assert 29_000 < r.pttl(readers) <= 30_000  # a shorter lease never cuts the key short
    r.zrem(readers, "long")  # given back: the key may outlive its leases, never the reverse
    time.sleep(0.2)
    assert acquire("next", 1_000) == 2  # "short" ended: dropped, not counted
    assert r.zscore(readers, "short") is None
    assert set(r.zrange(readers, 0, -1)) == {b"middle", b"next"}
    # At least as long as the longest live lease ("middle"; Redis 7 keeps the 30 s it had).
    assert 9_000 < r.pttl(readers) <= 30_000


def test_a_writer_or_a_waiting_writer_keeps_new_readers_out(
    read: tuple[Read, list[str]], r: redis.Redis
) -> None:
    acquire, (readers, writer, waiting) = read
    r.set(writer, "w", px=5_000)
    granted, ms = acquire("a")
    assert granted == 0 and 4_000 < ms <= 5_000
    r.delete(writer)
    assert acquire("a") == 1
    r.zadd(waiting, {"w": _now_ms(r) + 6_000})
    granted, ms = acquire("b")
    assert granted == 0 and 5_000 < ms <= 6_000  # until the writer's place lapses
    r.zadd(readers, {"a": _now_ms(r) + 2_000})  # (its lease nearly over)
    assert acquire("a") == 1  # a retry of a granted read: still ours, its lease renewed
    assert float(r.zscore(readers, "a") or 0) > _now_ms(r) + 5_000
    assert acquire("c", reentrant=True) == 2  # a read holder re-entering: not held back
    r.zadd(waiting, {"w": _now_ms(r) - 1})  # the writer's place lapsed
    assert acquire("b") == 3
    assert r.zcard(readers) == 3


def test_a_free_read_lock_costs_four_commands_on_redis_7(r: redis.Redis, prefix: str) -> None:
    if not r.eval("return redis.REDIS_VERSION_NUM and 1 or 0", 0):
        pytest.skip("Redis < 7.0: the read-then-expire path")
    script = r.register_script(READ)
    keys = [f"{prefix}{{c}}:readers", f"{prefix}{{c}}:writer", f"{prefix}{{c}}:waiting"]
    script(keys=keys, args=["warm", 1, "0"])  # loaded, and its lease ends at once
    r.delete(keys[0])
    before = r.info("commandstats")
    assert script(keys=keys, args=["t", 10_000, "0"]) == 1
    after = r.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): after[name]["calls"] - before.get(name, {}).get("calls", 0)
        for name in after
    }
    inner = {k: v for k, v in calls.items() if v and k not in ("evalsha", "info")}
    assert inner == {"time": 1, "exists": 1, "zadd": 1, "pexpire": 1}, inner
