"""The stampede-safe cache (get_or_fill, @cached) against a real redis-server on loopback."""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
import redmutex
from redmutex import _core
from redmutex._codec import make_codec
from redmutex._server import RedisServer

if TYPE_CHECKING:
    from conftest import MpProcs

FORK = multiprocessing.get_context("fork")


# --------------------------------------------------------------------------------------------
# Helpers (the fixtures redis_server, prefix, client, r and mp_procs come from conftest.py)
# --------------------------------------------------------------------------------------------


def value_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:value"


def fill_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fill"


def run_threads(n: int, target: Callable[[int], None], timeout: float = 60) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0.1))
    assert not any(t.is_alive() for t in threads), "threads did not finish in time"


# --------------------------------------------------------------------------------------------
# Basics
# --------------------------------------------------------------------------------------------


def test_miss_fills_and_stores_then_hits(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls = []

    def fill() -> dict[str, int]:
        calls.append(1)
        return {"answer": 42}

    assert redmutex.get_or_fill(client, "k", fill, ttl=30) == {"answer": 42}
    assert redmutex.get_or_fill(client, "k", fill, ttl=30) == {"answer": 42}
    assert len(calls) == 1
    # Only the value key remains, expiring with the ttl; the claim is gone.
    assert r.keys(f"{prefix}*") == [value_key(prefix, "k").encode()]
    assert 29_000 < r.pttl(value_key(prefix, "k")) <= 30_000


def test_none_is_cached_like_any_value(client: redmutex.Client) -> None:
    calls = []

    def fill() -> None:
        calls.append(1)

    assert redmutex.get_or_fill(client, "none", fill, ttl=30) is None
    assert redmutex.get_or_fill(client, "none", fill, ttl=30) is None
    assert len(calls) == 1


def test_value_expires_after_ttl(client: redmutex.Client) -> None:
    values = iter(range(10))
    first = redmutex.get_or_fill(client, "short", lambda: next(values), ttl=0.2, beta=0)
    time.sleep(0.3)
    assert redmutex.get_or_fill(client, "short", lambda: next(values), ttl=0.2, beta=0) == first + 1


def test_accepts_url_and_redis_py_clients(
    redis_server: RedisServer, r: redis.Redis, prefix: str
) -> None:
    name = prefix + "by-url"
    assert redmutex.get_or_fill(redis_server.url, name, lambda: "url", ttl=30) == "url"
    # The redis-py client reaches the same server (default prefix), so this is a hit.
    assert redmutex.get_or_fill(r, name, lambda: "other", ttl=30) == "url"
    assert r.exists(value_key("redmutex:", name))


def test_exports() -> None:
    assert "get_or_fill" in redmutex.__all__ and "cached" in redmutex.__all__


# --------------------------------------------------------------------------------------------
# The stampede: exactly one fill among threads and processes
# --------------------------------------------------------------------------------------------


def _stampede_call(url: str, prefix: str, barrier: Any, out: Any, fill_s: float) -> None:
    client = redmutex.Client(url, prefix=prefix)
    conn = redis.Redis.from_url(url)
    client.ping()

    def fill() -> str:
        n = conn.incr(prefix + "fills")
        time.sleep(fill_s)
        return f"value-{n}-{uuid.uuid4().hex}"

    barrier.wait(timeout=30)
    started = time.monotonic()
    try:
        value = redmutex.get_or_fill(client, "cold", fill, ttl=60)
        out.put(("ok", value, time.monotonic() - started))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put(("error", repr(exc), time.monotonic() - started))


def test_stampede_32_threads_and_8_processes_fill_once(
    redis_server: RedisServer, r: redis.Redis, prefix: str, mp_procs: MpProcs
) -> None:
    n_threads, n_procs, fill_s = 32, 8, 0.3
    barrier = FORK.Barrier(n_threads + n_procs)
    out = FORK.Queue()
    for _ in range(n_procs):
        mp_procs.start(_stampede_call, redis_server.url, prefix, barrier, out, fill_s)
    run_threads(
        n_threads,
        lambda _i: _stampede_call(redis_server.url, prefix, barrier, out, fill_s),
        timeout=90,
    )
    results = [out.get(timeout=30) for _ in range(n_threads + n_procs)]
    assert all(kind == "ok" for kind, _, _ in results), results
    assert int(r.get(prefix + "fills") or 0) == 1
    assert len({value for _, value, _ in results}) == 1
    # Nobody polled their way to a late answer: all are done shortly after the one fill.
    slowest = max(elapsed for _, _, elapsed in results)
    assert slowest < fill_s + 5, slowest
    assert not r.exists(fill_key(prefix, "cold"))


def test_waiters_are_woken_by_the_store_not_by_a_timer(client: redmutex.Client) -> None:
    """With a 60 s claim lease, waiters can only learn of the value through the wake-up."""
    release = threading.Event()
    results: dict[int, tuple[str, float]] = {}

    def fill() -> str:
        release.wait(10)
        return "stored"

    def call(i: int) -> None:
        if i:
            time.sleep(0.1)  # let caller 0 claim first
        value = redmutex.get_or_fill(client, "wake", fill, ttl=30, lock_ttl=60)
        results[i] = (value, time.monotonic())

    t = threading.Thread(target=run_threads, args=(8, call))
    t.start()
    time.sleep(0.5)
    assert not results
    stored_at = time.monotonic()
    release.set()
    t.join(30)
    assert {v for v, _ in results.values()} == {"stored"}
    assert max(at for _, at in results.values()) - stored_at < 2.0


# --------------------------------------------------------------------------------------------
# Failure hand-over
# --------------------------------------------------------------------------------------------


def _handover_call(url: str, prefix: str, barrier: Any, out: Any) -> None:
    client = redmutex.Client(url, prefix=prefix)
    conn = redis.Redis.from_url(url)
    client.ping()

    def fill() -> str:
        n = conn.incr(prefix + "fills")
        time.sleep(0.2)
        if n == 1:
            raise RuntimeError("the first fill fails")
        return f"filled-by-{n}"

    barrier.wait(timeout=30)
    try:
        out.put(("ok", redmutex.get_or_fill(client, "fragile", fill, ttl=60)))
    except RuntimeError as exc:
        out.put(("raised", str(exc)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put(("error", repr(exc)))


def test_fill_raising_hands_over_to_exactly_one_waiter(
    redis_server: RedisServer, r: redis.Redis, prefix: str, mp_procs: MpProcs
) -> None:
    n_threads, n_procs = 12, 4
    barrier = FORK.Barrier(n_threads + n_procs)
    out = FORK.Queue()
    for _ in range(n_procs):
        mp_procs.start(_handover_call, redis_server.url, prefix, barrier, out)
    run_threads(n_threads, lambda _i: _handover_call(redis_server.url, prefix, barrier, out))
    results = [out.get(timeout=30) for _ in range(n_threads + n_procs)]
    assert int(r.get(prefix + "fills") or 0) == 2  # the failed fill and one take-over
    raised = [res for res in results if res[0] == "raised"]
    ok = [res for res in results if res[0] == "ok"]
    assert raised == [("raised", "the first fill fails")]
    assert len(ok) == n_threads + n_procs - 1
    assert {value for _, value in ok} == {"filled-by-2"}


def test_fill_raising_without_waiters_leaves_nothing(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    def fill() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        redmutex.get_or_fill(client, "k", fill, ttl=30)
    assert r.keys(f"{prefix}*") == []
    assert redmutex.get_or_fill(client, "k", lambda: 1, ttl=30, timeout=0) == 1


@pytest.mark.parametrize("error", [GeneratorExit, KeyboardInterrupt, SystemExit])
def test_fill_raising_a_base_exception_gives_the_claim_back_at_once(
    client: redmutex.Client, r: redis.Redis, prefix: str, error: type[BaseException]
) -> None:
    """Not only Exceptions: the caller gets the fill's own BaseException and a waiter takes
    over through the give-back, not the lease. GeneratorExit used to come back as "RuntimeError:
    generator ignored GeneratorExit", its claim held (and renewed) while the caller kept it."""
    started = threading.Event()
    got: dict[str, Any] = {}

    def fill() -> str:
        started.set()
        time.sleep(0.2)  # the waiter is waiting by now
        raise error()

    def waiter() -> None:
        started.wait(10)
        t0 = time.monotonic()
        try:
            got["value"] = redmutex.get_or_fill(
                client, "base", lambda: "W", ttl=30, lock_ttl=30, timeout=8
            )
        except redmutex.LockTimeoutError as exc:
            got["value"] = exc
        got["took"] = time.monotonic() - t0

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    try:
        with pytest.raises(error) as raised:  # kept: its frames must not keep the claim alive
            redmutex.get_or_fill(client, "base", fill, ttl=30, lock_ttl=30)
    finally:
        t.join(10)
    assert type(raised.value) is error
    assert got.get("value") == "W"
    assert got["took"] < 5, got  # not the 30 s lease
    assert not r.exists(fill_key(prefix, "base"))


def _filler_that_hangs(url: str, prefix: str, lock_ttl: float) -> None:
    client = redmutex.Client(url, prefix=prefix)
    conn = redis.Redis.from_url(url)

    def fill() -> str:
        conn.incr(prefix + "fills")
        conn.set(prefix + "started", "1")
        time.sleep(600)
        return "never"

    redmutex.get_or_fill(client, "victim", fill, ttl=60, lock_ttl=lock_ttl)


def test_killed_filler_is_replaced_once_its_lease_ends(
    redis_server: RedisServer,
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    mp_procs: MpProcs,
) -> None:
    lock_ttl = 1.0
    child = mp_procs.start(_filler_that_hangs, redis_server.url, prefix, lock_ttl)
    deadline = time.monotonic() + 30
    while not r.get(prefix + "started"):
        assert time.monotonic() < deadline, "the child never started filling"
        time.sleep(0.01)
    result: dict[str, Any] = {}

    def waiter() -> None:
        result["value"] = redmutex.get_or_fill(
            client, "victim", lambda: "refilled", ttl=60, lock_ttl=lock_ttl
        )
        result["at"] = time.monotonic()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    # The fill outlives lock_ttl while its process lives: the claim is renewed meanwhile.
    time.sleep(2.5 * lock_ttl)
    assert "value" not in result
    assert int(r.get(prefix + "fills") or 0) == 1
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    t.join(30)
    assert result["value"] == "refilled"
    waited = result["at"] - killed_at
    # Renewed every lock_ttl/3, the dead filler's claim ends within lock_ttl of the kill.
    assert 0.3 * lock_ttl < waited < lock_ttl + 2.0, waited


def test_a_claim_dropped_unsettled_is_given_back(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    store = _core.CacheStore(client, ttl=30, lock_ttl=60)
    claim = store.fetch("dropped")
    assert isinstance(claim, _core.FillClaim) and claim.held
    assert r.get(fill_key(prefix, "dropped")) == claim.token.encode()
    del claim
    gc.collect()
    deadline = time.monotonic() + 5
    while r.exists(fill_key(prefix, "dropped")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    claim = store.fetch("dropped", timeout=0)
    assert isinstance(claim, _core.FillClaim)
    assert claim.abandon() is True
    with pytest.raises(redmutex.LockError):
        claim.abandon()


def test_a_store_lost_in_a_network_blip_gives_the_claim_back_once_redis_answers(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The filler's store and its give-back are both lost (the network drops them); once Redis
    answers again the give-back is sent again, so a waiter takes the fill over at once rather
    than after the claim's whole lease (``lock_ttl``) as if the filler had died."""
    from _proxy import FaultProxy

    caplog.set_level(logging.WARNING, logger="redmutex")
    with FaultProxy(redis_server.port).start() as proxy:
        filler = redmutex.Client(proxy.url, prefix=prefix, command_timeout=0.5)
        waiter = redmutex.Client(redis_server.url, prefix=prefix)
        filling = threading.Event()
        got: list[object] = []

        def fill() -> str:
            filling.set()
            time.sleep(0.2)  # the waiter is queued by now
            proxy.blackhole()  # the store (and the give-back after it) are lost
            return "lost"

        def wait() -> None:
            try:
                got.append(
                    redmutex.get_or_fill(
                        waiter, "blip", lambda: "w", ttl=30, lock_ttl=30, timeout=8
                    )
                )
            except redmutex.LockError as exc:
                got.append(exc)

        t = threading.Thread(target=wait, daemon=True)
        try:
            filling_thread = threading.Thread(
                target=lambda: got.append(
                    redmutex.get_or_fill(filler, "blip", fill, ttl=30, lock_ttl=30)
                ),
                daemon=True,
            )
            filling_thread.start()
            assert filling.wait(10)
            t.start()
            filling_thread.join(10)
            assert got == ["lost"], got  # the filler's caller still has its value
            time.sleep(0.5)
            healed = time.monotonic()
            proxy.heal()
            t.join(15)
            waited = time.monotonic() - healed
        finally:
            proxy.heal()
            filler.close()
            waiter.close()
    assert got == ["lost", "w"], got
    assert waited < 5.0, f"the waiter took the fill over {waited:.1f} s after Redis answered"
    assert "could not be stored" in caplog.text


# --------------------------------------------------------------------------------------------
# Timeouts and long fills
# --------------------------------------------------------------------------------------------


def test_timeout_waiting_for_another_fill(client: redmutex.Client) -> None:
    release = threading.Event()
    filling = threading.Event()

    def slow() -> str:
        filling.set()
        release.wait(10)
        return "slow"

    t = threading.Thread(
        target=lambda: redmutex.get_or_fill(client, "busy", slow, ttl=30), daemon=True
    )
    t.start()
    assert filling.wait(10)
    try:
        started = time.monotonic()
        with pytest.raises(redmutex.LockTimeoutError, match="busy") as caught:
            redmutex.get_or_fill(client, "busy", lambda: "mine", ttl=30, timeout=0.3)
        assert 0.25 < time.monotonic() - started < 3
        assert caught.value.name == "busy"  # the key, like any primitive's name
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # LockTimeoutError is a TimeoutError too
            redmutex.get_or_fill(client, "busy", lambda: "mine", ttl=30, timeout=0)
        assert time.monotonic() - started < 1
    finally:
        release.set()
        t.join(10)
    assert redmutex.get_or_fill(client, "busy", lambda: "mine", ttl=30, timeout=0) == "slow"


def test_a_fill_longer_than_lock_ttl_keeps_its_claim(
    client: redmutex.Client, r: redis.Redis
) -> None:
    fills = []

    def fill() -> str:
        fills.append(1)
        time.sleep(1.5)
        return "long"

    results = []

    def call(i: int) -> None:
        time.sleep(0.05 * i)
        results.append(redmutex.get_or_fill(client, "long", fill, ttl=30, lock_ttl=0.6))

    run_threads(4, call)
    assert results == ["long"] * 4
    assert len(fills) == 1


# --------------------------------------------------------------------------------------------
# Payloads: tampering, signing, serializers
# --------------------------------------------------------------------------------------------


def test_tampered_payload_is_a_miss_and_a_warning(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert redmutex.get_or_fill(client, "t", lambda: "good", ttl=30) == "good"
    r.set(value_key(prefix, "t"), b"garbage written by somebody else")
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        assert redmutex.get_or_fill(client, "t", lambda: "refilled", ttl=30) == "refilled"
    warnings = [rec for rec in caplog.records if rec.name == "redmutex"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "'t'" in warnings[0].getMessage()
    # The garbage was replaced: the next call is a plain hit.
    assert redmutex.get_or_fill(client, "t", lambda: "again", ttl=30) == "refilled"


def test_tampered_payload_under_concurrency_fills_once(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    r.set(value_key(prefix, "g"), b"RM\x01\x02garbage")
    fills = []

    def fill() -> str:
        fills.append(1)
        time.sleep(0.2)
        return "clean"

    results = []
    run_threads(16, lambda _i: results.append(redmutex.get_or_fill(client, "g", fill, ttl=30)))
    assert results == ["clean"] * 16
    assert len(fills) == 1


def test_foreign_key_type_is_a_miss(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    r.hset(value_key(prefix, "h"), "field", "value")
    assert redmutex.get_or_fill(client, "h", lambda: "string now", ttl=30) == "string now"
    assert r.type(value_key(prefix, "h")) == b"string"


class _Exploit:
    ran = False

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return (_exploit_ran, ())


def _exploit_ran() -> None:
    _Exploit.ran = True


def test_unsigned_payload_is_never_unpickled_with_a_secret(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    forged = make_codec("pickle").encode(_Exploit(), 0.1, context="s")
    r.set(value_key(prefix, "s"), forged)
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        value = redmutex.get_or_fill(client, "s", lambda: "safe", ttl=30, secret=b"k1")
    assert value == "safe"
    assert not _Exploit.ran
    assert any("signed" in rec.getMessage() for rec in caplog.records)


def test_signed_payloads(client: redmutex.Client, r: redis.Redis, prefix: str, caplog: Any) -> None:
    assert redmutex.get_or_fill(client, "sig", lambda: [1, 2], ttl=30, secret=b"k1") == [1, 2]
    payload = r.get(value_key(prefix, "sig"))
    assert payload is not None and len(payload) > 32
    # Same secret: a hit. Another secret: a miss (and a warning), filled and signed anew.
    other: Callable[[], Any] = lambda: "x"  # never called: the signed value is a hit
    assert redmutex.get_or_fill(client, "sig", other, ttl=30, secret=b"k1") == [1, 2]
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        assert redmutex.get_or_fill(client, "sig", lambda: "k2", ttl=30, secret=b"k2") == "k2"
    assert any("signature" in rec.getMessage() for rec in caplog.records)
    # A valid signed payload copied to another key fails too: it is bound to its key.
    signed = r.get(value_key(prefix, "sig"))
    assert signed is not None
    r.set(value_key(prefix, "copy"), signed)
    assert redmutex.get_or_fill(client, "copy", lambda: "own", ttl=30, secret=b"k2") == "own"


def test_json_and_custom_serializers(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    assert redmutex.get_or_fill(client, "j", lambda: {"a": [1, 2]}, ttl=30, serializer="json") == {
        "a": [1, 2]
    }
    payload = r.get(value_key(prefix, "j"))
    assert payload is not None and b'{"a":[1,2]}' in payload
    zero: Callable[[], Any] = lambda: 0  # never called: a hit
    assert redmutex.get_or_fill(client, "j", zero, ttl=30, serializer="json") == {"a": [1, 2]}

    class Upper:
        def dumps(self, obj: str) -> bytes:
            return obj.upper().encode()

        def loads(self, data: bytes) -> str:
            return data.decode().lower()

    assert redmutex.get_or_fill(client, "c", lambda: "MiXed", ttl=30, serializer=Upper()) == (
        "mixed"  # the filler gets the value as it round-trips, as later callers do
    )
    assert redmutex.get_or_fill(client, "c", lambda: "?", ttl=30, serializer=Upper()) == "mixed"
    # A payload of another serializer is a miss, not a misread.
    assert redmutex.get_or_fill(client, "c", lambda: "p", ttl=30, serializer="pickle") == "p"


def test_every_caller_gets_the_value_as_it_round_trips(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    # JSON turns a tuple into a list: the filler's caller gets the list too, not its own tuple.
    first = redmutex.get_or_fill(client, "rt", lambda: (1, 2), ttl=30, serializer="json")
    later = redmutex.get_or_fill(client, "rt", lambda: (3, 4), ttl=30, serializer="json")
    assert first == later == [1, 2]

    @redmutex.cached(client, ttl=30, key="rt-cached", serializer="json")
    def pair() -> tuple[int, int]:
        return (5, 6)

    assert pair() == pair() == [5, 6]

    # One dumps and one loads per fill, none more (the filler already has the bytes).
    calls: list[str] = []

    class Counting:
        def dumps(self, obj: Any) -> bytes:
            calls.append("dumps")
            return json.dumps(obj).encode()

        def loads(self, data: bytes) -> Any:
            calls.append("loads")
            return json.loads(data)

    original = {"k": (1,)}
    got = redmutex.get_or_fill(client, "rt-count", lambda: original, ttl=30, serializer=Counting())
    assert got == {"k": [1]} and got is not original
    assert calls == ["dumps", "loads"]

    # Pickle: an equal copy, as every other caller gets.
    value = ["a"]
    copy = redmutex.get_or_fill(client, "rt-pickle", lambda: value, ttl=30)
    assert copy == value and copy is not value


def test_a_serializer_that_cannot_load_its_own_bytes_stores_nothing(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    class OneWay:
        def dumps(self, obj: Any) -> bytes:
            return b"x"

        def loads(self, data: bytes) -> Any:
            raise LookupError("cannot load")

    with pytest.raises(LookupError, match="cannot load"):
        redmutex.get_or_fill(client, "oneway", lambda: 1, ttl=30, serializer=OneWay())
    assert not r.exists(value_key(prefix, "oneway"), fill_key(prefix, "oneway"))


def test_unserializable_value_raises_and_releases_the_claim(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    with pytest.raises(TypeError):
        redmutex.get_or_fill(client, "bad", lambda: {1, 2}, ttl=30, serializer="json")
    assert not r.exists(fill_key(prefix, "bad"))
    assert redmutex.get_or_fill(client, "bad", lambda: [1], ttl=30, serializer="json", timeout=0)


# --------------------------------------------------------------------------------------------
# @cached: keys and invalidate
# --------------------------------------------------------------------------------------------


def test_cached_with_template_key_and_invalidate(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls: list[int] = []

    @redmutex.cached(client, ttl=30, key="user:{user_id}")
    def load(user_id: int, verbose: bool = False) -> dict[str, int]:
        calls.append(user_id)
        return {"id": user_id, "n": len(calls)}

    assert load(1) == {"id": 1, "n": 1}
    assert load(user_id=1, verbose=True) == {"id": 1, "n": 1}
    assert load(2) == {"id": 2, "n": 2}
    assert r.exists(value_key(prefix, "user:1"), value_key(prefix, "user:2")) == 2
    assert load.invalidate(1) is True
    assert load.invalidate(1) is False
    assert load(1) == {"id": 1, "n": 3}
    assert load(2) == {"id": 2, "n": 2}
    assert load.__name__ == "load" and load.__wrapped__ is not None


def test_constant_key_is_shared_with_get_or_fill(client: redmutex.Client) -> None:
    @redmutex.cached(client, ttl=30, key="stats")
    def stats() -> str:
        return "from-decorator"

    assert redmutex.get_or_fill(client, "stats", lambda: "from-function", ttl=30) == (
        "from-function"
    )
    assert stats() == "from-function"


@redmutex.cached(redmutex.Client("redis://127.0.0.1:1"), ttl=30)  # never called
def module_cached(x: int) -> int:
    return x


def module_cached_on(key: str | None = None) -> Any:
    """@cached on a client that is never called (for what needs no server)."""
    return redmutex.cached(redmutex.Client("redis://127.0.0.1:1"), ttl=30, key=key)


def derived(url: str, retries: int = 3, *, tags: tuple[str, ...] = ()) -> str:
    return f"{url}/{retries}/{tags}"


def test_derived_keys_are_stable_and_readable(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    fetch = redmutex.cached(client, ttl=30)(derived)
    assert fetch("http://x") == "http://x/3/()"
    name = f"{__name__}.derived(url='http://x', retries=3, tags=())"
    assert r.exists(value_key(prefix, name))
    # Positional, keyword and defaulted spellings of one call share the entry.
    assert fetch(url="http://x", retries=3) == "http://x/3/()"
    assert r.keys(f"{prefix}*") == [value_key(prefix, name).encode()]
    assert fetch.invalidate("http://x", 3) is True


def _derive_in_child(out: Any) -> None:
    from redmutex._callkeys import derive_key

    out.put(derive_key(derived, ("http://x",), {"tags": ("a", "b")}))


def test_derived_keys_match_in_another_process(mp_procs: MpProcs) -> None:
    from redmutex._callkeys import derive_key

    out = FORK.Queue()
    mp_procs.start(_derive_in_child, out)
    here = derive_key(derived, ("http://x",), {"tags": ("a", "b")})
    assert out.get(timeout=30) == here


def test_derived_keys_reject_unstable_arguments(client: redmutex.Client) -> None:
    @redmutex.cached(client, ttl=30)
    def by_object(thing: object) -> int:
        return 1

    with pytest.raises(TypeError, match="thing.*key="):
        by_object(object())
    with pytest.raises(TypeError, match="key="):
        by_object.invalidate(object())


def test_cached_methods_bind_and_leave_self_out_of_derived_keys(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls: list[tuple[Any, ...]] = []

    class Repo:
        def __init__(self, n: int) -> None:
            self.n = n

        @redmutex.cached(client, ttl=30)
        def load(self, x: int) -> int:
            calls.append(("load", self.n, x))
            return x * 10

        @redmutex.cached(client, ttl=30, key="repo:{self.n}:{x}")
        def own(self, x: int) -> int:
            return self.n * 100 + x

        @redmutex.cached(client, ttl=30, key=lambda self, x: f"fn:{self.n}:{x}")
        def by_function(self, x: int) -> int:
            return self.n * 1000 + x

        @redmutex.cached(client, ttl=30)  # type: ignore[arg-type]
        @classmethod
        def make(cls, x: int) -> str:
            calls.append(("make", cls.__name__, x))
            return f"{cls.__name__}:{x}"

        @redmutex.cached(client, ttl=30)  # type: ignore[arg-type]
        @staticmethod
        def static(x: int) -> int:
            calls.append(("static", x))
            return -x

    where = f"{__name__}.{Repo.__qualname__}"
    # key=None: self is left out, so every instance shares the entry of load(x=5).
    assert Repo(1).load(5) == 50
    assert Repo(2).load(5) == 50
    assert calls == [("load", 1, 5)]
    assert r.exists(value_key(prefix, f"{where}.load(x=5)"))
    assert Repo(2).load.invalidate(5) is True  # bound: the instance goes first
    assert Repo.load.invalidate(Repo(3), 5) is False  # unbound: pass it yourself
    assert Repo(3).load(x=5) == 50
    assert calls == [("load", 1, 5), ("load", 3, 5)]

    # Per-instance entries: a template or a key function that reads self.
    assert (Repo(1).own(2), Repo(2).own(2)) == (102, 202)
    assert Repo(1).own.invalidate(2) is True
    assert r.exists(value_key(prefix, "repo:2:2")) and not r.exists(value_key(prefix, "repo:1:2"))
    assert Repo(4).by_function(3) == 4003
    assert r.exists(value_key(prefix, "fn:4:3"))
    assert Repo(4).by_function.invalidate(3) is True

    # Above @classmethod / @staticmethod: bound to the class, or not bound at all.
    assert Repo.make(7) == Repo(1).make(7) == "Repo:7"
    assert r.exists(value_key(prefix, f"{where}.make(x=7)"))
    assert Repo.make.invalidate(7) is True
    assert Repo.static(3) == Repo(1).static(3) == -3
    assert r.exists(value_key(prefix, f"{where}.static(x=3)"))
    assert Repo(1).static.invalidate(3) is True
    assert calls.count(("make", "Repo", 7)) == 1 and calls.count(("static", 3)) == 1

    # The bound form looks like the function.
    bound = Repo(1).load
    assert bound.__name__ == "load" and bound.__wrapped__ is not None
    assert Repo.load.__name__ == "load" and Repo.load.__doc__ is None


def test_cached_function_pickles_by_reference() -> None:
    import pickle

    assert pickle.loads(pickle.dumps(module_cached)) is module_cached


class PickledRepo:
    """Module-level, so that pickle finds it by name."""

    def __init__(self, n: int) -> None:
        self.n = n

    @module_cached_on(key="picklerepo:{self.n}:{x}")
    def load(self, x: int) -> int:
        return self.n * x

    @module_cached_on()
    @classmethod
    def make(cls, x: int) -> int:
        return x


def test_a_bound_cached_method_pickles_like_a_bound_method() -> None:
    """``executor.submit(obj.load, 5)`` pickles ``obj.load``. Before: unpickling it recursed
    (RecursionError; a ProcessPoolExecutor's worker died of it, BrokenProcessPool), and a
    @cached classmethod raised PicklingError ("not the same object")."""
    import pickle

    bound = pickle.loads(pickle.dumps(PickledRepo(3).load))
    assert bound.__self__.n == 3 and bound.__func__ is PickledRepo.__dict__["load"]
    assert pickle.loads(pickle.dumps(PickledRepo.make)) == PickledRepo.make


def test_a_key_function_must_return_a_str(client: redmutex.Client) -> None:
    @redmutex.cached(client, ttl=30, key=lambda x: x)  # type: ignore[arg-type,return-value]
    def f(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="returned int, expected a str"):
        f(1)
    with pytest.raises(TypeError, match="key must be a str, a callable or None"):
        redmutex.cached(client, ttl=30, key=42)(f)  # type: ignore[arg-type]


def test_cached_validates_at_decoration_time(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="ttl"):
        redmutex.cached(client, ttl=-1)
    with pytest.raises(ValueError, match="nope"):

        @redmutex.cached(client, ttl=1, key="x:{nope}")
        def f(a: int) -> int:
            return a

    # An empty key names no entry: refused here, not by every call in production.
    for cached in (redmutex.cached, redmutex.aio.cached):
        with pytest.raises(ValueError, match="key must not be empty"):

            @cached(client, ttl=1, key="")
            def empty() -> int:
                return 1

    with pytest.raises(TypeError, match="aio"):

        @redmutex.cached(client, ttl=1)
        async def g() -> int:
            return 1

    # A generator is no value a serializer stores: every call claimed, ran, failed and gave
    # the claim back. Refused at decoration, as @locked refuses what it cannot wrap.
    with pytest.raises(TypeError, match="generator function"):

        @redmutex.cached(client, ttl=1)
        def gen() -> Iterator[int]:
            yield 1

    with pytest.raises(TypeError, match="generator function"):

        @redmutex.aio.cached(client, ttl=1)
        async def agen() -> AsyncIterator[int]:
            yield 1


# --------------------------------------------------------------------------------------------
# Invalidation while a fill runs
# --------------------------------------------------------------------------------------------


def test_invalidate_during_a_fill_drops_its_result(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    filling, release = threading.Event(), threading.Event()
    got: list[str] = []

    def old() -> str:
        filling.set()
        release.wait(10)
        return "old"

    t = threading.Thread(
        target=lambda: got.append(redmutex.get_or_fill(client, "inv", old, ttl=30)), daemon=True
    )
    t.start()
    assert filling.wait(10)
    store = _core.CacheStore(client, ttl=30)
    assert store.invalidate("inv") is False  # no value yet, but the fill's claim is dropped
    release.set()
    t.join(10)
    assert got == ["old"]  # its caller still gets it...
    assert not r.exists(value_key(prefix, "inv"))  # ...but it is not stored
    assert redmutex.get_or_fill(client, "inv", lambda: "new", ttl=30) == "new"


# --------------------------------------------------------------------------------------------
# XFetch: early refresh under a steady stream of calls
# --------------------------------------------------------------------------------------------


def test_xfetch_refreshes_before_expiry_and_nobody_waits(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    ttl, fill_s, run_s = 1.0, 0.1, 4.0
    vkey = value_key(prefix, "hot")
    codec = make_codec("pickle")
    local = threading.local()
    # Per fill: (generation it makes, value's pttl at its start, fills running, generation
    # stored when it started).
    fills: list[tuple[int, float, int, int | None]] = []
    active = [0]
    guard = threading.Lock()

    def fill() -> int:
        local.filled = True
        with guard:
            active[0] += 1
            overlap = active[0]
        pttl = r.pttl(vkey)
        payload = cast("bytes | None", r.get(vkey))
        replaced = None if payload is None else codec.decode(payload, context="hot").value
        time.sleep(fill_s)
        with guard:
            active[0] -= 1
            fills.append((len(fills) + 1, pttl, overlap, replaced))
            return len(fills)

    calls: list[tuple[float, float, bool, int]] = []  # (start, latency, filled, value)
    stop = time.monotonic() + run_s
    gaps: list[float] = []  # times at which the value was missing after the first store

    def monitor() -> None:
        seen = False
        while time.monotonic() < stop:
            if r.exists(vkey):
                seen = True
            elif seen:
                gaps.append(time.monotonic())
            time.sleep(0.002)

    def reader(_i: int) -> None:
        while time.monotonic() < stop:
            local.filled = False
            started = time.monotonic()
            value = redmutex.get_or_fill(client, "hot", fill, ttl=ttl, beta=1.0)
            calls.append((started, time.monotonic() - started, local.filled, value))
            time.sleep(0.002)

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    run_threads(4, reader, timeout=run_s + 30)
    watcher.join(10)
    first_done = min(s + lat for s, lat, filled, _ in calls if filled)
    later = [c for c in calls if c[0] > first_done]
    assert len(later) > 200
    # After the first store the value never went missing, so nobody could wait for a fill (a
    # caller waits only when there is no value); every refresh ran while it was there, one at a
    # time, and the value changed before it expired.
    assert not gaps, f"the value was missing at {len(gaps)} samples"
    assert len(fills) >= 3
    assert fills[0][3] is None
    for generation, pttl, overlap, replaced in fills[1:]:
        assert pttl > 0, (generation, pttl)
        assert overlap == 1
        assert replaced == generation - 1  # it refreshed the value stored just before it
    # Exactly one refresh per stored value (each generation was replaced once, by the next).
    replaced_ones = [replaced for *_, replaced in fills[1:]]
    assert len(set(replaced_ones)) == len(replaced_ones), fills
    # Readers that did not refill were served from the cache (a generous bound for slow CI).
    slow = [lat for _, lat, filled, _ in later if not filled and lat > 1.0]
    assert not slow, slow
    values = [v for _, _, _, v in sorted(calls)]
    assert len(set(values)) == len(fills)


def test_beta_zero_never_refreshes_early(client: redmutex.Client) -> None:
    fills = []

    def fill() -> int:
        fills.append(1)
        return len(fills)

    stop = time.monotonic() + 0.8
    while time.monotonic() < stop:
        assert redmutex.get_or_fill(client, "calm", fill, ttl=1.0, beta=0) == 1
        time.sleep(0.005)
    assert len(fills) == 1


def test_xfetch_decision_uses_redis_time_left_and_the_random_draw(
    client: redmutex.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """δ = 1000 s and 30 s left: a reader refreshes iff 30 <= 1000·(-ln r), i.e. r <= 0.9704."""
    from redmutex import _cache

    codec = make_codec("pickle")
    store = _core.CacheStore(client, ttl=30)
    claim = store.fetch("soon")
    assert isinstance(claim, _core.FillClaim)
    claim.store(codec.encode("old", 1000.0, context="soon"))
    monkeypatch.setattr(_cache, "_random", lambda: 0.98)  # just too large: no refresh
    assert {redmutex.get_or_fill(client, "soon", lambda: "new", ttl=30) for _ in range(5)} == {
        "old"
    }
    assert redmutex.get_or_fill(client, "soon", lambda: "new", ttl=30, beta=0) == "old"
    draws = iter([0.96, 0.5, 0.5])  # the first draw refreshes; the new value's δ is tiny
    monkeypatch.setattr(_cache, "_random", lambda: next(draws))
    assert redmutex.get_or_fill(client, "soon", lambda: "new", ttl=30) == "new"
    assert redmutex.get_or_fill(client, "soon", lambda: "newer", ttl=30) == "new"


def _store_with_delta(client: redmutex.Client, name: str, value: Any, delta: float) -> None:
    """Stores `value` under `name` (ttl 30 s) as if its fill had taken `delta` s."""
    claim = _core.CacheStore(client, ttl=30).fetch(name)
    assert isinstance(claim, _core.FillClaim)
    claim.store(make_codec("pickle").encode(value, delta, context=name))


def test_xfetch_refresh_whose_fill_raises_serves_the_current_value(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The early refresher is a reader of a valid value: a failed refresh is logged and gives
    the claim back, the reader gets the value it read, and a later refresh tries again."""
    from redmutex import _cache

    _store_with_delta(client, "early", "old", 1000.0)  # δ = 1000 s: every draw below refreshes
    monkeypatch.setattr(_cache, "_random", lambda: 0.5)
    payload = r.get(value_key(prefix, "early"))
    calls: list[int] = []

    def failing() -> str:
        calls.append(1)
        raise ConnectionRefusedError("backend down")

    with caplog.at_level(logging.WARNING, logger="redmutex"):
        for _ in range(3):
            assert redmutex.get_or_fill(client, "early", failing, ttl=30) == "old"
            assert not r.exists(fill_key(prefix, "early"))  # given back at once
    assert len(calls) == 3  # each read was picked, claimed anew and tried
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all(
        rec.exc_info and isinstance(rec.exc_info[1], ConnectionRefusedError) for rec in warnings
    )
    assert "'early'" in warnings[0].getMessage()
    assert r.get(value_key(prefix, "early")) == payload  # untouched, still valid
    assert redmutex.get_or_fill(client, "early", lambda: "new", ttl=30) == "new"


def test_xfetch_refresh_that_redis_refuses_to_claim_serves_the_current_value(
    make_server: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis full (maxmemory, noeviction): reads work, the refresh's claim (a write) is refused.
    The reader picked to refresh read a valid value and gets it, as with beta=0; a miss, which
    has no value to fall back on, still raises."""
    from redmutex import _cache

    server = make_server()
    admin = redis.Redis.from_url(server.url)
    with redmutex.Client(server.url) as client:
        _store_with_delta(client, "full", "old", 1000.0)  # δ = 1000 s: every draw refreshes
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", max(int(admin.info("memory")["used_memory"]) - 100_000, 1))
        monkeypatch.setattr(_cache, "_random", lambda: 0.5)
        calls: list[int] = []

        def fill() -> str:
            calls.append(1)
            return "new"

        with caplog.at_level(logging.WARNING, logger="redmutex"):
            assert redmutex.get_or_fill(client, "full", fill, ttl=30, beta=0) == "old"
            assert redmutex.get_or_fill(client, "full", fill, ttl=30) == "old"
        assert calls == []
        assert "early refresh" in caplog.text and "OOM" in caplog.text
        with pytest.raises(redmutex.LockError, match="OOM"):
            redmutex.get_or_fill(client, "cold", fill, ttl=30)
        admin.config_set("maxmemory", 0)
        assert redmutex.get_or_fill(client, "full", fill, ttl=30) == "new"


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_xfetch_refresh_interrupted_propagates_and_gives_the_claim_back(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    error: type[BaseException],
) -> None:
    """An interrupt is no fill failure: it reaches the refresher, which gives the claim back."""
    from redmutex import _cache

    _store_with_delta(client, "early", "old", 1000.0)
    monkeypatch.setattr(_cache, "_random", lambda: 0.5)

    def interrupted() -> str:
        raise error()

    with pytest.raises(error):
        redmutex.get_or_fill(client, "early", interrupted, ttl=30)
    assert not r.exists(fill_key(prefix, "early"))
    assert redmutex.get_or_fill(client, "early", lambda: "new", ttl=30) == "new"


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"ttl": -1}, ValueError, "ttl"),
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": float("nan")}, ValueError, "ttl"),
        ({"ttl": float("inf")}, ValueError, "ttl"),
        ({"ttl": True}, TypeError, "ttl"),
        ({"ttl": "1"}, TypeError, "ttl"),
        ({"ttl": 10**30}, ValueError, "ttl"),
        ({"ttl": 1, "lock_ttl": 0}, ValueError, "lock_ttl"),
        ({"ttl": 1, "lock_ttl": None}, TypeError, "lock_ttl"),
        ({"ttl": 1, "timeout": -1}, ValueError, "timeout"),
        ({"ttl": 1, "timeout": math.inf}, None, None),
        ({"ttl": 1, "beta": -0.5}, ValueError, "beta"),
        ({"ttl": 1, "beta": "1"}, TypeError, "beta"),
        ({"ttl": 1, "serializer": "yaml"}, ValueError, "serializer"),
        ({"ttl": 1, "serializer": object()}, TypeError, "serializer"),
        ({"ttl": 1, "secret": "text"}, TypeError, "secret"),
        ({"ttl": 1, "secret": b""}, ValueError, "secret"),
    ],
)
def test_arguments_are_checked(
    client: redmutex.Client, kwargs: dict[str, Any], error: type[Exception] | None, name: str
) -> None:
    if error is None:
        assert redmutex.get_or_fill(client, "args", lambda: 1, **kwargs) == 1
        return
    with pytest.raises(error, match=name):
        redmutex.get_or_fill(client, "args", lambda: 1, **kwargs)


def test_key_and_fill_are_checked(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="key"):
        redmutex.get_or_fill(client, "", lambda: 1, ttl=1)
    with pytest.raises(TypeError, match="key"):
        redmutex.get_or_fill(client, b"bytes", lambda: 1, ttl=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        redmutex.get_or_fill(client, "\ud800", lambda: 1, ttl=1)
    with pytest.raises(TypeError, match="fill"):
        redmutex.get_or_fill(client, "k", 42, ttl=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client"):
        redmutex.get_or_fill(42, "k", lambda: 1, ttl=1)


def test_binary_safe_keys(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    name = "a\0{b}:c ü"
    assert redmutex.get_or_fill(client, name, lambda: "odd", ttl=30) == "odd"
    assert r.exists(value_key(prefix, name).encode())
    assert redmutex.get_or_fill(client, name, lambda: "other", ttl=30) == "odd"


def test_json_payload_is_what_json_says(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    redmutex.get_or_fill(client, "jj", lambda: {"x": 1}, ttl=30, serializer="json")
    payload = r.get(value_key(prefix, "jj"))
    assert payload is not None
    assert json.loads(payload[16:]) == {"x": 1}  # the codec's 16-byte header, then the body


def test_cache_demo_reports_one_fill(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from redmutex._demos.cache import cache_demo

    assert cache_demo(redis_server.url, threads=6, processes=2, fill_seconds=0.2) == 0
    out = capsys.readouterr().out
    assert "fills: 1 " in out and "same report: yes" in out
    assert "redmutex-demo" not in out  # nothing internal leaks into the story


def test_a_fill_asking_for_its_own_entry_raises_instead_of_hanging(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    def fill() -> str:
        return redmutex.get_or_fill(client, "self", fill, ttl=30)

    with pytest.raises(RuntimeError, match="its own fill"):
        redmutex.get_or_fill(client, "self", fill, ttl=30)
    assert not r.exists(fill_key(prefix, "self"))

    # Through another client of the same server and prefix it is the same entry (it hung: the
    # guard compared the client objects).
    same_place = redmutex.Client(client.url, prefix=prefix)

    def fill_through_another_client() -> str:
        return redmutex.get_or_fill(same_place, "self", fill, ttl=30, timeout=5)

    with pytest.raises(RuntimeError, match="its own fill"):
        redmutex.get_or_fill(client, "self", fill_through_another_client, ttl=30)
    # Other entries may be filled from within a fill.
    outer = redmutex.get_or_fill(
        client, "outer", lambda: redmutex.get_or_fill(client, "inner", lambda: 1, ttl=30), ttl=30
    )
    assert outer == 1


def _spellings_of(server: RedisServer) -> list[tuple[str, Callable[[], Any]]]:
    """Clients of the server's db 0 with the default prefix, each spelled otherwise."""
    port = server.port
    return [
        ("no db", lambda: redmutex.Client(f"redis://127.0.0.1:{port}")),
        ("db 0", lambda: redmutex.Client(f"redis://127.0.0.1:{port}/0")),
        ("a query", lambda: redmutex.Client(f"redis://127.0.0.1:{port}/0?socket_timeout=5")),
        ("redis.Redis", lambda: redis.Redis(host="127.0.0.1", port=port, db=0)),
    ]


def test_a_fill_asking_for_its_own_entry_through_a_url_spelled_otherwise_raises(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """The same server, db and prefix spelled otherwise is the same entry: the fill waited for
    its own claim (for ever with timeout=None), renewed while it waited."""
    spellings = _spellings_of(redis_server)
    for outer_name, make_outer in spellings:
        for inner_name, make_inner in spellings:
            outer, inner = make_outer(), make_inner()
            key = f"spelled-{uuid.uuid4().hex[:8]}"

            def fill(inner: Any = inner, key: str = key) -> str:
                return redmutex.get_or_fill(inner, key, lambda: "inner", ttl=30, timeout=3)

            with pytest.raises(RuntimeError, match="its own fill"):
                redmutex.get_or_fill(outer, key, fill, ttl=30)
            assert not r.exists(fill_key("redmutex:", key)), (outer_name, inner_name)
            outer.close()
            inner.close()


def test_a_fill_may_ask_for_the_same_key_of_another_db_or_prefix(redis_server: RedisServer) -> None:
    """Only Redis tells a URL spelled otherwise from another place: the same key there is
    another entry, filled as any other."""
    port = redis_server.port
    outer = redmutex.Client(f"redis://127.0.0.1:{port}")
    for elsewhere in (
        redmutex.Client(f"redis://127.0.0.1:{port}/1"),
        redmutex.Client(f"redis://127.0.0.1:{port}/0", prefix="other:"),
    ):
        key = f"elsewhere-{uuid.uuid4().hex[:8]}"

        def fill(elsewhere: redmutex.Client = elsewhere, key: str = key) -> int:
            return redmutex.get_or_fill(elsewhere, key, lambda: 7, ttl=30, timeout=3)

        assert redmutex.get_or_fill(outer, key, fill, ttl=30) == 7
        assert redmutex.get_or_fill(elsewhere, key, lambda: 0, ttl=30) == 7  # stored there
        elsewhere.close()
    outer.close()


def _store_in_child(claim: Any, out: Any) -> None:
    try:
        claim.store(b"from the child")
        out.put("stored")
    except redmutex.LockError as exc:
        out.put(f"refused: {exc}")


def test_a_fill_claim_is_not_usable_in_a_forked_child(
    client: redmutex.Client, r: redis.Redis, prefix: str, mp_procs: MpProcs
) -> None:
    store = _core.CacheStore(client, ttl=30)
    claim = store.fetch("forked")
    assert isinstance(claim, _core.FillClaim)
    out = FORK.Queue()
    child = mp_procs.start(_store_in_child, claim, out)
    assert out.get(timeout=30).startswith("refused: ")
    mp_procs.kill(child)  # reaped (it has exited by now): its exit touched nothing either
    assert r.get(fill_key(prefix, "forked")) == claim.token.encode()  # still the parent's
    assert claim.store(b"from the parent") is True


def test_unreachable_server_raises_connection_error_in_time() -> None:
    from redmutex._server import free_port

    client = redmutex.Client(
        f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5, command_timeout=0.5
    )
    fills = []
    started = time.monotonic()
    with pytest.raises(redmutex.ConnectionError):
        redmutex.get_or_fill(client, "k", lambda: fills.append(1), ttl=1)
    assert time.monotonic() - started < 3
    assert not fills  # nothing is computed when the cache cannot be asked


def test_a_redlock_client_without_a_majority_is_a_quorum_error(redis_url: str) -> None:
    # The cache works on Redlock (tests/test_redlock_primitives.py); with one master of three
    # reachable it says so, and nothing is computed.
    masters = redmutex.Client(
        [redis_url, "redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"], connect_timeout=0.5
    )
    fills: list[int] = []
    with pytest.raises(redmutex.QuorumError, match="majority"):
        redmutex.get_or_fill(masters, "k", lambda: fills.append(1), ttl=1)
    assert not fills


@pytest.mark.timeout(180)
def test_on_a_redis_cluster() -> None:
    """No direct connections on a cluster: every step goes through the runtime (slot routing)."""
    from _scale_servers import Cluster

    with Cluster(3) as cluster:
        client = redmutex.Client(cluster=cluster.urls, prefix="cc:", command_timeout=5.0)
        fills: list[int] = []

        def fill() -> str:
            fills.append(1)
            time.sleep(0.3)
            return "clustered"

        results: list[str] = []
        run_threads(
            8, lambda _i: results.append(redmutex.get_or_fill(client, "k", fill, ttl=30)), 60
        )
        assert results == ["clustered"] * 8 and len(fills) == 1
        # Entries of other names land on other masters, each filled once.
        for n in range(20):
            assert redmutex.get_or_fill(client, f"user:{n}", functools.partial(int, n), ttl=30) == n
            assert redmutex.get_or_fill(client, f"user:{n}", lambda: -1, ttl=30) == n

        @redmutex.cached(client, ttl=30, key="stats:{day}")
        def stats(day: str) -> str:
            fills.append(1)
            return day

        assert stats("mon") == "mon" and stats("mon") == "mon" and len(fills) == 2
        assert stats.invalidate("mon") is True
        with pytest.raises(ValueError, match="hash slot"):
            redmutex.get_or_fill(client, "}bad", lambda: 1, ttl=30)


def test_an_async_fill_is_refused_with_a_pointer_to_aio(client: redmutex.Client) -> None:
    async def fetch() -> str:
        return "async"

    with pytest.raises(TypeError, match="redmutex.aio.get_or_fill"):
        redmutex.get_or_fill(client, "async-fill", fetch, ttl=30)
    # A plain callable that returns a coroutine: refused once called, its claim given back.
    with pytest.raises(TypeError, match="awaitable"):
        redmutex.get_or_fill(client, "async-fill", lambda: fetch(), ttl=30)
    started = time.monotonic()
    assert redmutex.get_or_fill(client, "async-fill", lambda: "sync", ttl=30, timeout=5) == "sync"
    assert time.monotonic() - started < 2  # nobody's claim was left behind
