"""The write side's acquire script of the read-write lock (src/protocol/lua/rw_write_acquire.lua),
as the Rust core sends it, on Redis >= 7.0 (one `SET NX PX GET` takes a free write lock or reads
its holder) and on the path of older servers (the version hidden from the script). With nobody
reading it counts the live readers with one `ZCOUNT` instead of dropping the ended ones first.
These tests pin what must not change: a free write lock is taken and its waiting place given
back, a retry finds its own token, a writer or a live reader keeps it out, ended readers never
count, and a refused writer is told to look again when the soonest live lease ends (not at once,
because of an ended one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redmutex._core import _script_source
from test_fence_script import AS_BEFORE_7

WRITE = _script_source("rw_write_acquire")
LEASE_MS, PLACE_MS = 10_000, 6_000
CHANNEL = "wake-rw"

Write = Callable[..., Any]


def _now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture(params=[False, True], ids=["redis7", "before7"])
def write(
    request: pytest.FixtureRequest, r: redis.Redis, prefix: str
) -> Iterator[tuple[Write, list[str]]]:
    version = tuple(int(part) for part in str(r.info("server")["redis_version"]).split(".")[:2])
    if not request.param and version < (7, 0):
        pytest.skip("SET NX PX GET needs Redis >= 7.0: the server takes the other path only")
    script = r.register_script((AS_BEFORE_7 if request.param else "") + WRITE)
    keys = [f"{prefix}{{rw}}:readers", f"{prefix}{{rw}}:writer", f"{prefix}{{rw}}:waiting"]

    def acquire(token: str, join: bool = False, lease_ms: int = LEASE_MS) -> Any:
        args: list[str | int] = [token, lease_ms, PLACE_MS, "1" if join else "0", CHANNEL]
        return script(keys=keys, args=args)  # type: ignore[no-any-return]

    yield acquire, keys
    r.delete(*keys)


def test_a_free_write_lock_is_taken_and_the_place_given_back(
    write: tuple[Write, list[str]], r: redis.Redis
) -> None:
    acquire, (_, writer, waiting) = write
    r.zadd(waiting, {"w": _now_ms(r) + PLACE_MS, "other": _now_ms(r) + PLACE_MS})
    assert acquire("w") == 0
    assert r.get(writer) == b"w"
    assert LEASE_MS - 1_000 < r.pttl(writer) <= LEASE_MS
    assert r.zrange(waiting, 0, -1) == [b"other"]
    # A retry finds its own token: granted, its lease renewed from now (the token may be a lost
    # Redlock round's, not given back, whose lease would end before the caller's).
    r.pexpire(writer, 5_000)
    assert acquire("w", lease_ms=30_000) == 0
    assert 25_000 < r.pttl(writer) <= 30_000


def test_another_writer_keeps_it_and_a_joining_writer_waits(
    write: tuple[Write, list[str]], r: redis.Redis
) -> None:
    acquire, (_, writer, waiting) = write
    r.set(writer, "a", px=4_000)
    granted, ms = acquire("b", join=True)
    assert granted == 0 and 3_000 < ms <= 4_000
    assert r.get(writer) == b"a"
    assert r.zscore(waiting, "b") is not None
    assert 0 < r.pttl(waiting) <= PLACE_MS
    granted, _ = acquire("c")  # a try that does not join
    assert granted == 0 and r.zscore(waiting, "c") is None


def test_live_readers_keep_it_and_ended_ones_never_count(
    write: tuple[Write, list[str]], r: redis.Redis
) -> None:
    acquire, (readers, writer, _) = write
    now = _now_ms(r)
    r.zadd(readers, {"ended": now - 5, "live": now + 3_000})
    granted, ms = acquire("w")
    # The soonest *live* lease tells when to look again (the ended one is dropped, not waited on).
    assert granted == 0 and 2_000 < ms <= 3_000
    assert not r.exists(writer)
    assert r.zrange(readers, 0, -1) == [b"live"]
    r.zadd(readers, {"live": _now_ms(r) - 1})  # its lease ends: nobody reads any more
    assert acquire("w") == 0
    assert r.get(writer) == b"w"


def _published(wake: Any) -> list[bytes]:
    """The messages the channel got so far (a PING through the subscription marks the end)."""
    wake.ping(b"end")
    got: list[bytes] = []
    for _ in range(50):
        message = wake.get_message(timeout=1.0)
        if message is None:
            continue
        if message["type"] == "pong":
            return got
        got.append(message["data"])
    raise AssertionError(f"no pong after {got}")


def test_a_writer_that_takes_it_from_its_place_wakes_the_readers_held_back(
    write: tuple[Write, list[str]], r: redis.Redis
) -> None:
    """Readers held back by a waiting writer's place were told to look again when it lapses: the
    writer that takes the lock from that place tells them ('') to look now (its lease may run
    out unreleased). A writer that never waited tells nobody (the common, uncontended case)."""
    acquire, (readers, writer, waiting) = write
    wake = r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(CHANNEL)
    try:
        assert acquire("plain") == 0
        assert _published(wake) == []
        r.delete(writer)
        r.zadd(readers, {"live": _now_ms(r) + 3_000})
        granted, _ = acquire("w", join=True)
        assert granted == 0 and r.zscore(waiting, "w") is not None
        assert _published(wake) == []
        r.zadd(readers, {"live": _now_ms(r) - 1})  # its lease ends unreleased
        assert acquire("w", join=True) == 0
        assert r.get(writer) == b"w" and not r.exists(waiting)
        assert _published(wake) == [b""]
    finally:
        wake.close()
