"""The Redis-in-Action recipe functions and the @locked decorator."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redmutex
from redmutex import acquire_lock, redis_lock, release_lock

if TYPE_CHECKING:
    from conftest import PyProcs
    from redmutex._server import RedisServer

DEFAULT_PREFIX = "redmutex:"


def _key(prefix: str, name: str, suffix: str = "lock") -> bytes:
    return (prefix + "{" + name + "}:" + suffix).encode("utf-8")


@pytest.fixture
def lockname(r: redis.Redis) -> Iterator[str]:
    """A unique lock name under the default prefix; its fence counter is removed afterwards."""
    name = f"recipe-{uuid.uuid4().hex}"
    yield name
    r.delete(_key(DEFAULT_PREFIX, name), _key(DEFAULT_PREFIX, name, "fence"))


# ------------------------------------------------------------------ acquire_lock / release_lock


@pytest.mark.timeout(30)
def test_acquire_and_release_with_redis_py(r: redis.Redis, lockname: str) -> None:
    ident = acquire_lock(r, lockname)
    assert isinstance(ident, str) and ident
    assert r.get(_key(DEFAULT_PREFIX, lockname)) == ident.encode()
    t0 = time.monotonic()
    assert acquire_lock(r, lockname, atime=0.3) is False
    assert 0.25 <= time.monotonic() - t0 < 3.0
    assert release_lock(r, lockname, ident) is True
    assert r.exists(_key(DEFAULT_PREFIX, lockname)) == 0
    # a second release finds nothing of ours: "we lost the lock"
    assert release_lock(r, lockname, ident) is False
    again = acquire_lock(r, lockname, atime=1)
    assert isinstance(again, str) and again != ident
    assert release_lock(r, lockname, again) is True


@pytest.mark.timeout(30)
def test_release_with_wrong_identifier_keeps_lock(r: redis.Redis, lockname: str) -> None:
    ident = acquire_lock(r, lockname)
    assert isinstance(ident, str)
    assert release_lock(r, lockname, "0" * 32) is False
    assert release_lock(r, lockname, uuid.uuid4().hex) is False
    assert r.get(_key(DEFAULT_PREFIX, lockname)) == ident.encode()
    assert acquire_lock(r, lockname, atime=0.1) is False
    assert release_lock(r, lockname, ident) is True


@pytest.mark.timeout(30)
def test_release_lock_of_a_reentrant_hold_leaves_nothing_but_the_fence(
    r: redis.Redis, lockname: str
) -> None:
    """A re-entrant Lock's token given to `release_lock` frees the lock and its hold count: the
    count was left behind until the lease ended."""
    lock = redmutex.Lock(r, lockname, ttl=30, reentrant=True)
    assert lock.acquire(timeout=5) and lock.acquire(timeout=5)
    assert r.exists(_key(DEFAULT_PREFIX, lockname, "lock:holds"))
    assert release_lock(r, lockname, lock.token) is True
    left = set(r.scan_iter(match=_key(DEFAULT_PREFIX, lockname, "*")))
    assert left == {_key(DEFAULT_PREFIX, lockname, "fence")}


@pytest.mark.timeout(30)
def test_given_identifier_is_used(r: redis.Redis, lockname: str) -> None:
    mine = uuid.uuid4().hex
    assert acquire_lock(r, lockname, identifier=mine) == mine
    assert acquire_lock(r, lockname, identifier=uuid.uuid4().hex, atime=0.1) is False
    assert release_lock(r, lockname, mine) is True


@pytest.mark.timeout(30)
def test_ltime_is_the_lease(r: redis.Redis, lockname: str) -> None:
    ident = acquire_lock(r, lockname, ltime=0.5)
    assert isinstance(ident, str)
    assert 0 < r.pttl(_key(DEFAULT_PREFIX, lockname)) <= 500
    time.sleep(0.8)
    other = acquire_lock(r, lockname, atime=0.5)
    assert isinstance(other, str)
    assert release_lock(r, lockname, ident) is False
    assert r.get(_key(DEFAULT_PREFIX, lockname)) == other.encode()
    assert release_lock(r, lockname, other) is True


@pytest.mark.timeout(30)
def test_atime_waits_for_expiry(r: redis.Redis, lockname: str) -> None:
    t0 = time.monotonic()
    assert isinstance(acquire_lock(r, lockname, ltime=1), str)
    ident = acquire_lock(r, lockname, atime=5)
    elapsed = time.monotonic() - t0
    assert isinstance(ident, str)
    assert 1.0 - 0.01 <= elapsed < 1.0 + 1.5
    assert release_lock(r, lockname, ident) is True


@pytest.mark.timeout(30)
def test_atime_wakes_on_release(r: redis.Redis, lockname: str) -> None:
    holder = acquire_lock(r, lockname, ltime=30)
    assert isinstance(holder, str)
    timer = threading.Timer(0.5, release_lock, args=(r, lockname, holder))
    timer.start()
    t0 = time.monotonic()
    ident = acquire_lock(r, lockname, atime=10)
    elapsed = time.monotonic() - t0
    timer.join(5)
    assert isinstance(ident, str)
    assert 0.4 <= elapsed < 1.5
    assert release_lock(r, lockname, ident) is True


@pytest.mark.timeout(30)
def test_recipes_accept_client_and_url(
    client: redmutex.Client, redis_url: str, r: redis.Redis, prefix: str, lockname: str
) -> None:
    ident = acquire_lock(client, "acct")
    assert isinstance(ident, str)
    assert r.get(_key(prefix, "acct")) == ident.encode()
    assert redmutex.Lock(client, "acct").locked() is True
    assert release_lock(client, "acct", ident) is True
    assert r.exists(_key(prefix, "acct")) == 0

    ident = acquire_lock(redis_url, lockname)
    assert isinstance(ident, str)
    assert r.get(_key(DEFAULT_PREFIX, lockname)) == ident.encode()
    assert release_lock(redis_url, lockname, ident) is True


# ------------------------------------------------------------------------------ redis_lock


@pytest.mark.timeout(30)
def test_redis_lock_context(r: redis.Redis, lockname: str) -> None:
    with redis_lock(r, lockname) as identifier:
        assert isinstance(identifier, str) and identifier
        assert r.get(_key(DEFAULT_PREFIX, lockname)) == identifier.encode()
        assert acquire_lock(r, lockname, atime=0.1) is False
    assert r.exists(_key(DEFAULT_PREFIX, lockname)) == 0
    assert release_lock(r, lockname, identifier) is False


@pytest.mark.timeout(30)
def test_redis_lock_could_not_acquire(r: redis.Redis, lockname: str) -> None:
    holder = acquire_lock(r, lockname)
    assert isinstance(holder, str)
    t0 = time.monotonic()
    with (
        pytest.raises(redmutex.LockError, match="could not acquire lock"),
        redis_lock(r, lockname, atime=0.3),
    ):
        pytest.fail("the block must not run")
    assert 0.25 <= time.monotonic() - t0 < 3.0
    assert r.get(_key(DEFAULT_PREFIX, lockname)) == holder.encode()
    assert release_lock(r, lockname, holder) is True


@pytest.mark.timeout(30)
def test_redis_lock_lost(r: redis.Redis, lockname: str) -> None:
    with (
        pytest.raises(redmutex.LockLostError, match="lock was lost"),
        redis_lock(r, lockname, ltime=0.2),
    ):
        time.sleep(0.6)


@pytest.mark.timeout(30)
def test_redis_lock_releases_on_error(r: redis.Redis, lockname: str) -> None:
    with pytest.raises(LookupError), redis_lock(r, lockname, atime=1, ltime=5):
        raise LookupError("inside")
    assert r.exists(_key(DEFAULT_PREFIX, lockname)) == 0


@pytest.mark.timeout(30)
def test_redis_lock_lost_while_body_raised_keeps_body_exception(
    r: redis.Redis, lockname: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Like `with Lock`: the body's exception propagates, the loss is a WARNING on "redmutex".
    with (
        caplog.at_level(logging.WARNING, logger="redmutex"),
        pytest.raises(KeyError, match="body") as caught,
        redis_lock(r, lockname, ltime=0.2),
    ):
        time.sleep(0.6)
        raise KeyError("body")
    assert not isinstance(caught.value.__context__, redmutex.LockError)
    records = [rec for rec in caplog.records if rec.name == "redmutex"]
    assert [rec.levelno for rec in records] == [logging.WARNING]
    message = records[0].getMessage()
    assert lockname in message
    assert "on leaving a block that raised: lock was lost" in message


@pytest.mark.timeout(60)
def test_redis_lock_failed_release_while_body_raised_keeps_body_exception(
    make_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server()
    client = redmutex.Client(server.url, connect_timeout=1, command_timeout=1)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="redmutex"),
            pytest.raises(KeyError, match="body"),
            redis_lock(client, "gone", ltime=10),
        ):
            server.stop()
            raise KeyError("body")
    finally:
        client.close()
    messages = [rec.getMessage() for rec in caplog.records if rec.name == "redmutex"]
    assert any("'gone': on leaving a block that raised" in m for m in messages), messages


# ------------------------------------------------------------------------------ @locked


@pytest.mark.timeout(30)
def test_locked_fills_template_from_arguments(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    seen: list[tuple[str, bool, bool]] = []

    @redmutex.locked(client, "lock:{sender}", ttl=10, timeout=10)
    def transfer_funds(conn: object, sender: str, recipient: str, amount: int) -> str:
        """Move money."""
        held = r.get(_key(prefix, "lock:" + sender))
        other = r.exists(_key(prefix, "lock:" + recipient))
        seen.append((sender, held is not None, bool(other)))
        return f"{sender}->{recipient}:{amount}"

    assert transfer_funds.__name__ == "transfer_funds"
    assert transfer_funds.__doc__ == "Move money."
    assert transfer_funds(None, "alice", "bob", 5) == "alice->bob:5"
    assert transfer_funds(conn=None, sender="bob", recipient="carol", amount=1) == "bob->carol:1"
    assert transfer_funds(None, "carol", amount=2, recipient="alice") == "carol->alice:2"
    assert seen == [("alice", True, False), ("bob", True, False), ("carol", True, False)]
    leftover = {k for k in r.keys(prefix + "*") if not k.endswith(b":fence")}
    assert leftover == set()
    assert set(r.keys(prefix + "*")) == {
        _key(prefix, "lock:alice", "fence"),
        _key(prefix, "lock:bob", "fence"),
        _key(prefix, "lock:carol", "fence"),
    }


@pytest.mark.timeout(30)
def test_locked_uses_defaults_and_non_str_values(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    names: list[bytes] = []

    @redmutex.locked(client, "job:{region}:{n}", ttl=5, timeout=5)
    def job(n: int, region: str = "eu") -> int:
        names.extend(k for k in r.keys(prefix + "*") if k.endswith(b":lock"))
        return n * 2

    assert job(21) == 42
    assert job(3, region="us") == 6
    assert job(n=7) == 14
    assert names == [
        _key(prefix, "job:eu:21"),
        _key(prefix, "job:us:3"),
        _key(prefix, "job:eu:7"),
    ]


@pytest.mark.timeout(30)
def test_locked_static_name_and_exceptions(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    @redmutex.locked(client, "static", ttl=5, timeout=5)
    def fail() -> None:
        assert r.exists(_key(prefix, "static")) == 1
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fail()
    assert r.exists(_key(prefix, "static")) == 0


@pytest.mark.timeout(30)
def test_locked_timeout(client: redmutex.Client, redis_url: str, prefix: str) -> None:
    other = redmutex.Client(redis_url, prefix=prefix)
    try:
        holder = redmutex.Lock(other, "lock:alice", ttl=20)
        assert holder.acquire()
        calls: list[str] = []

        @redmutex.locked(client, "lock:{sender}", ttl=10, timeout=0.3)
        def transfer(sender: str) -> None:
            calls.append(sender)

        t0 = time.monotonic()
        with pytest.raises(redmutex.LockTimeoutError):
            transfer("alice")
        assert 0.25 <= time.monotonic() - t0 < 3.0
        transfer("bob")  # another name is not blocked
        assert calls == ["bob"]
        holder.release()
        transfer("alice")
        assert calls == ["bob", "alice"]
    finally:
        other.close()


@pytest.mark.timeout(60)
def test_locked_excludes_same_name_only(client: redmutex.Client) -> None:
    state = {"inside": 0, "max_inside": 0, "counter": 0}
    guard = threading.Lock()
    barrier = threading.Barrier(2, timeout=10)

    @redmutex.locked(client, "acct:{who}", ttl=10, timeout=30)
    def bump(who: str, rendezvous: bool = False) -> None:
        if rendezvous:
            # both threads must be inside at once: different names do not exclude each other
            barrier.wait()
            return
        with guard:
            state["inside"] += 1
            state["max_inside"] = max(state["max_inside"], state["inside"])
        value = state["counter"]
        time.sleep(0.001)
        state["counter"] = value + 1
        with guard:
            state["inside"] -= 1

    errors: list[BaseException] = []

    def run(fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pair = [
        threading.Thread(target=run, args=(lambda w=w: bump(w, rendezvous=True),))
        for w in ("x", "y")
    ]
    for t in pair:
        t.start()
    for t in pair:
        t.join(20)
    assert errors == []

    workers = [
        threading.Thread(target=run, args=(lambda: [bump("same") for _ in range(20)],))
        for _ in range(6)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join(50)
    assert not any(t.is_alive() for t in workers)
    assert errors == []
    assert state["max_inside"] == 1
    assert state["counter"] == 120


@pytest.mark.timeout(30)
def test_locked_accepts_redis_py_and_url(r: redis.Redis, redis_url: str) -> None:
    tag = uuid.uuid4().hex
    for conn in (r, redis_url):

        @redmutex.locked(conn, "dec-" + tag + "-{x}", ttl=5, timeout=5)
        def f(x: int) -> bool:
            return r.exists(_key(DEFAULT_PREFIX, f"dec-{tag}-{x}")) == 1

        assert f(1) is True
        assert f(x=2) is True
    for x in (1, 2):
        assert r.exists(_key(DEFAULT_PREFIX, f"dec-{tag}-{x}")) == 0
        r.delete(_key(DEFAULT_PREFIX, f"dec-{tag}-{x}", "fence"))


# ------------------------------------------------------------------------- the book example

TRANSFER_SCRIPT = r"""
import json
import random
import sys

import redis

from redmutex import redis_lock

def transfer_funds(conn, sender, recipient, amount):     # conn: a redis.Redis
    with redis_lock(conn, "lock:" + sender):
        if int(conn.hget(sender, "money") or 0) < amount:
            return False
        pipe = conn.pipeline(True)
        pipe.hincrby(sender, "money", -amount)
        pipe.hincrby(recipient, "money", amount)
        pipe.execute()
        return True

url, accounts, n, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
conn = redis.Redis.from_url(url)
rng = random.Random(seed)
ok = 0
lowest = None
for _ in range(n):
    sender, recipient = rng.sample(accounts, 2)
    if transfer_funds(conn, sender, recipient, rng.randint(1, 400)):
        ok += 1
    balance = int(conn.hget(sender, "money"))
    lowest = balance if lowest is None else min(lowest, balance)
print(json.dumps({"ok": ok, "lowest": lowest}))
"""


@pytest.mark.timeout(240)
def test_book_transfer_funds_from_8_processes(
    redis_url: str, r: redis.Redis, prefix: str, procs: PyProcs
) -> None:
    accounts = [f"{prefix}acct:{i}" for i in range(4)]
    for a in accounts:
        r.hset(a, "money", 500)
    total = 500 * len(accounts)
    children = [
        procs.start(TRANSFER_SCRIPT, redis_url, json.dumps(accounts), "60", str(seed))
        for seed in range(8)
    ]
    results = []
    for child in children:
        rc, out, err = procs.wait(child, timeout=200)
        assert rc == 0, err
        results.append(json.loads(out))
    balances = [int(r.hget(a, "money") or 0) for a in accounts]
    assert sum(balances) == total
    assert min(balances) >= 0
    assert all(res["lowest"] >= 0 for res in results)
    assert sum(res["ok"] for res in results) > 0
    # the locks are gone; only fence counters remain
    for a in accounts:
        assert r.exists(_key(DEFAULT_PREFIX, "lock:" + a)) == 0
        r.delete(_key(DEFAULT_PREFIX, "lock:" + a, "fence"))


# ------------------------------------------------------- @locked and async / generator functions


@pytest.mark.timeout(30)
def test_locked_refuses_async_callables(client: redmutex.Client) -> None:
    decorate = redmutex.locked(client, "job:{x}", ttl=5, timeout=5)

    async def job(x: int) -> int:
        return x

    async def stream(x: int) -> AsyncIterator[int]:
        yield x

    class AsyncCallable:
        async def __call__(self, x: int) -> int:
            return x

    refused: list[Any] = [job, stream, functools.partial(job), AsyncCallable()]
    for func in refused:
        with pytest.raises(TypeError, match=r"redmutex\.aio\.locked"):
            decorate(func)


@pytest.mark.timeout(30)
def test_locked_refuses_a_coroutine_returned_by_a_plain_function(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def body() -> None:
        raise AssertionError("never runs")

    @redmutex.locked(client, "later", ttl=5, timeout=5)
    def later() -> Any:
        return body()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused coroutine is closed, not left unawaited
        with pytest.raises(TypeError, match=r"returned coroutine .*redmutex\.aio\.locked"):
            later()
    assert r.exists(_key(prefix, "later")) == 0


@pytest.mark.timeout(30)
def test_locked_generator_holds_the_lock_across_the_iteration(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    def held() -> bool:
        return r.exists(_key(prefix, "gen:7")) == 1

    @redmutex.locked(client, "gen:{n}", ttl=5, timeout=5)
    def steps(n: int) -> Iterator[int]:
        for i in range(3):
            yield n + i
        return

    assert inspect.isgeneratorfunction(steps)
    it = steps(7)
    assert not held()  # a generator runs nothing, and takes nothing, before its first next()
    seen = []
    for value in it:
        seen.append((value, held()))
    assert seen == [(7, True), (8, True), (9, True)]
    assert not held()

    # Closed early: the lock goes with it. An exception from the body releases it too.
    early = steps(7)
    assert next(early) == 7 and held()
    early.close()
    assert not held()

    @redmutex.locked(client, "gen:{n}", ttl=5, timeout=5)
    def failing(n: int) -> Iterator[int]:
        yield n
        raise LookupError("inside")

    with pytest.raises(LookupError):
        for _ in failing(7):
            assert held()
    assert not held()

    # send() and the generator's return value pass through.
    @redmutex.locked(client, "gen:{n}", ttl=5, timeout=5)
    def echo(n: int) -> Generator[int, int, str]:
        got = yield n
        assert held()
        return f"got {got}"

    it2 = echo(7)
    assert next(it2) == 7
    with pytest.raises(StopIteration) as stop:
        it2.send(5)
    assert stop.value.value == "got 5"
    assert not held()


@pytest.mark.timeout(30)
def test_locked_generators_in_disguise_hold_the_lock_or_are_refused(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """Before: each of these ran its generator body after the lock was released, unguarded."""

    def held() -> bool:
        return r.exists(_key(prefix, "disguised")) == 1

    decorate = redmutex.locked(client, "disguised", ttl=5, timeout=5)

    # An object whose __call__ is a generator function: held across the iteration, like one.
    class Steps:
        def __call__(self) -> Iterator[bool]:
            yield held()

    assert list(decorate(Steps())()) == [True]
    assert not held()

    # A plain wrapper (functools.wraps) around a generator function, and a generator
    # expression: what they return has not started, its body would run unlocked. Refused.
    def passthrough(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

        return wrapper

    def steps() -> Iterator[bool]:
        yield held()

    wrapped = decorate(passthrough(steps))

    @decorate
    def lazy() -> Iterator[bool]:
        return (held() for _ in range(1))

    for func in (wrapped, lazy):
        with pytest.raises(TypeError, match=r"returned a generator that had not started"):
            func()
        assert not held()

    # Values computed under the lock pass through.
    @decorate
    def eager() -> list[bool]:
        return [held()]

    assert eager() == [True]

    # @contextmanager: its body runs on entering, after the call. Refused at decoration,
    # pointing to the order that holds the lock from entering the block to leaving it.
    def body() -> Iterator[bool]:
        yield held()

    with pytest.raises(TypeError, match=r"@contextlib\.contextmanager function.*Put "):
        decorate(contextlib.contextmanager(body))
    with pytest.raises(TypeError, match=r"@contextlib\.asynccontextmanager function"):
        decorate(contextlib.asynccontextmanager(_async_body))
    with contextlib.contextmanager(decorate(body))() as inside:
        assert inside is True and held()
    assert not held()


async def _async_body() -> AsyncIterator[None]:
    yield


@pytest.mark.timeout(30)
def test_redis_lock_as_a_decorator_follows_the_rules_of_locked(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """Before: as a @contextmanager object, redis_lock(...) decorated anything with a plain
    call, so an async def's or a generator's body ran after the lock was released."""

    def held() -> bool:
        return r.exists(_key(prefix, "deco")) == 1

    decorate = redis_lock(client, "deco", atime=5, ltime=5)

    @decorate
    def plain() -> bool:
        return held()

    assert plain() is True and plain() is True  # each call a block of its own
    assert not held()

    @decorate
    def steps() -> Iterator[bool]:
        yield held()
        yield held()

    assert list(steps()) == [True, True]
    assert not held()

    async def job() -> bool:
        return held()

    refused: list[Any] = [job, _async_body, functools.partial(job)]
    for func in refused:
        with pytest.raises(TypeError, match=r"redis_lock.*redmutex\.aio\.locked"):
            decorate(func)
    with pytest.raises(TypeError, match=r"@contextlib\.contextmanager function"):
        decorate(contextlib.contextmanager(steps.__wrapped__))  # type: ignore[attr-defined]

    @decorate
    def lazy() -> Iterator[bool]:
        return (held() for _ in range(1))

    with pytest.raises(TypeError, match=r"returned a generator that had not started"):
        lazy()

    # The object is still one `with` block, as before.
    with redis_lock(client, "deco", atime=5, ltime=5) as identifier:
        assert isinstance(identifier, str) and held()
    assert not held()


LOCKED_WORKER = r"""
import sys
import time

import redis
import redmutex

url, prefix, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = redis.Redis.from_url(url)
client = redmutex.Client(url, prefix=prefix)
inside, counter = prefix + "inside", prefix + "counter"


def enter():
    if conn.incr(inside) > 1:
        conn.incr(prefix + "overlaps")


def critical():
    value = int(conn.get(counter) or 0)
    time.sleep(0.002)
    conn.set(counter, value + 1)


@redmutex.locked(client, "shared", ttl=10, timeout=60)
def plain():
    enter()
    critical()
    conn.decr(inside)


@redmutex.locked(client, "shared", ttl=10, timeout=60)
def stepwise():
    enter()
    yield
    critical()
    yield
    conn.decr(inside)


for i in range(rounds):
    if i % 2:
        plain()
    else:
        for _ in stepwise():
            time.sleep(0.001)
print("done")
"""


@pytest.mark.timeout(240)
def test_locked_excludes_across_processes_functions_and_generators(
    redis_url: str, r: redis.Redis, prefix: str, procs: PyProcs
) -> None:
    workers, rounds = 4, 20
    children = [procs.start(LOCKED_WORKER, redis_url, prefix, str(rounds)) for _ in range(workers)]
    for child in children:
        rc, out, err = procs.wait(child, timeout=200)
        assert rc == 0, err
        assert out.strip() == "done"
    assert int(r.get(prefix + "counter") or 0) == workers * rounds
    assert r.get(prefix + "overlaps") is None
    r.delete(prefix + "counter", prefix + "inside", _key(prefix, "shared", "fence"))


LOCKED_TYPES = """
from collections.abc import AsyncIterator, Iterator

import redmutex

client = redmutex.Client()


@redmutex.locked(client, "job:{x}")
async def job(x: int) -> int:
    return x


@redmutex.locked(client, "job:{x}")
async def stream(x: int) -> AsyncIterator[int]:
    yield x


@redmutex.locked(client, "job:{x}")
def plain(x: int) -> int:
    return x


@redmutex.locked(client, "job:{x}")
def steps(x: int) -> Iterator[int]:
    yield x


async def main() -> None:
    await job(1)  # flagged
    async for _ in stream(1):  # flagged
        pass
    total: int = plain(1) + sum(steps(2))
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_flags_locked_on_async_functions(tmp_path: Path) -> None:
    source = tmp_path / "locked_types.py"
    source.write_text(LOCKED_TYPES, encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            str(source),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
    )
    errors = sorted(line.split(":")[1] for line in done.stdout.splitlines() if ": error:" in line)
    flagged = [
        str(number)
        for number, line in enumerate(LOCKED_TYPES.splitlines(), 1)
        if line.endswith("# flagged")
    ]
    assert errors == flagged, done.stdout + done.stderr
    assert '"UseAioLocked" not callable' in done.stdout


# ------------------------------------------------- two callers passing the same identifier

SAME_IDENTIFIER_WORKER = r"""
import sys
import threading
import time

import redis
from redmutex import acquire_lock, release_lock

url, name, rounds, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
conn = redis.Redis.from_url(url)
inside, overlaps, held = name + ":inside", name + ":overlaps", name + ":held"
deadline = time.monotonic() + seconds


def worker():
    for _ in range(rounds):
        if time.monotonic() > deadline:
            return
        if not acquire_lock(conn, name, identifier="worker-1", atime=10, ltime=10):
            continue
        conn.incr(held)
        if conn.incr(inside) > 1:
            conn.incr(overlaps)
        time.sleep(0.001)
        conn.decr(inside)
        release_lock(conn, name, "worker-1")


threads = [threading.Thread(target=worker) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
"""


@pytest.mark.timeout(120)
def test_callers_with_the_same_identifier_never_hold_at_once(
    redis_url: str, r: redis.Redis, lockname: str, procs: PyProcs
) -> None:
    # A token already in place is never a call's own grant: two processes
    # with three threads each, all passing identifier="worker-1", must take turns.
    children = [
        procs.start(SAME_IDENTIFIER_WORKER, redis_url, lockname, "150", "10") for _ in range(2)
    ]
    for child in children:
        rc, out, err = procs.wait(child, timeout=100)
        assert rc == 0 and out.strip() == "done", err
    held = int(r.get(lockname + ":held") or 0)
    overlaps = int(r.get(lockname + ":overlaps") or 0)
    r.delete(lockname + ":held", lockname + ":inside", lockname + ":overlaps")
    assert held >= 50, held
    assert overlaps == 0, f"{overlaps} of {held} holds overlapped another"


@pytest.mark.timeout(60)
def test_a_resend_after_a_dropped_reply_never_counts_the_token_in_place(
    redis_server: RedisServer, r: redis.Redis, lockname: str
) -> None:
    # The attempt ran, its reply was lost with the connection, and the resend finds the call's
    # identifier in place. It cannot tell a grant of its first send from another call's hold of
    # that identifier (see test_recipes_faults), so it never counts it: the call is not granted
    # and its lost grant lapses after `ltime`, after which the name is free again.
    from _proxy import FaultProxy

    identifier = "resend-" + uuid.uuid4().hex
    with FaultProxy(redis_server.port) as proxy:
        client = redmutex.Client(proxy.url, prefix=DEFAULT_PREFIX)
        try:
            warm = acquire_lock(client, lockname, atime=0)  # script loaded, connection open
            assert warm and release_lock(client, lockname, warm)
            proxy.drop_reply_to(identifier.encode())
            got = acquire_lock(client, lockname, identifier=identifier, atime=0, ltime=1)
            assert proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
            assert got is False
            assert r.get(_key(DEFAULT_PREFIX, lockname)) == identifier.encode()
            # ...a second call with that identifier is refused too, until the lease ends.
            assert acquire_lock(client, lockname, identifier=identifier, atime=0) is False
            time.sleep(1.3)
            assert r.get(_key(DEFAULT_PREFIX, lockname)) is None
            assert acquire_lock(client, lockname, identifier=identifier, atime=0) == identifier
            assert release_lock(client, lockname, identifier) is True
        finally:
            client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("leaves_by", ["exit", "end of block"])
def test_a_forked_child_leaving_the_block_keeps_the_parents_lock(
    r: redis.Redis, lockname: str, leaves_by: str
) -> None:
    # A process that forks holds none of the parent's locks in the child: leaving the `with`
    # there (sys.exit, or the block's end) must not release the parent's, which is still inside.
    parent = os.getpid()
    try:
        with redis_lock(r, lockname, ltime=30) as identifier:
            pid = os.fork()
            if pid == 0 and leaves_by == "exit":
                sys.exit(0)
            if pid != 0:
                os.waitpid(pid, 0)
                assert r.get(_key(DEFAULT_PREFIX, lockname)) == identifier.encode()
                assert acquire_lock(r, lockname, atime=0) is False  # still the parent's
    except SystemExit:
        assert os.getpid() != parent
    finally:
        if os.getpid() != parent:
            os._exit(0)  # the child never runs the rest of the test
    assert r.get(_key(DEFAULT_PREFIX, lockname)) is None  # the parent released it, no loss


def test_locked_checks_its_name_at_decoration(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="name"):
        redmutex.locked(client, "", ttl=5)
    with pytest.raises(ValueError, match=r"^name 'job:\{nobody\}' of "):

        @redmutex.locked(client, "job:{nobody}", ttl=5)
        def job(x: int) -> int:
            return x
