"""The Lock section of the contract."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import calls_delta as _delta
from _helpers import command_calls as _calls
from redmutex._server import RedisServer

if TYPE_CHECKING:
    from conftest import PyProcs

KeyOf = Callable[[str, str], bytes]
TOKEN_RE = re.compile(r"[0-9a-f]{32}")


def _prefix_keys(r: redis.Redis, prefix: str) -> set[bytes]:
    return set(r.scan_iter(match=prefix.encode() + b"*", count=1000))


@pytest.fixture
def other_client(redis_url: str, prefix: str) -> Iterator[redmutex.Client]:
    """A second, independent Client (its own connections) on the same prefix."""
    c = redmutex.Client(redis_url, prefix=prefix)
    try:
        yield c
    finally:
        c.close()


# ------------------------------------------------------------------------------ basics


@pytest.mark.timeout(30)
def test_acquire_release_state(
    client: redmutex.Client, r: redis.Redis, prefix: str, key_of: KeyOf
) -> None:
    lock = redmutex.Lock(client, "basic", ttl=5)
    assert lock.token is None
    assert lock.fence is None
    assert lock.remaining() is None
    assert lock.lost is False
    assert lock.locked() is False
    assert lock.owned() is False

    assert lock.acquire() is True
    assert isinstance(lock.token, str)
    assert TOKEN_RE.fullmatch(lock.token), lock.token
    assert isinstance(lock.fence, int) and not isinstance(lock.fence, bool)
    rem = lock.remaining()
    assert isinstance(rem, float)
    assert 3.0 < rem <= 5.0
    assert lock.locked() is True
    assert lock.owned() is True
    assert lock.lost is False
    assert r.get(key_of("basic", "lock")) == lock.token.encode()
    assert 3000 < r.pttl(key_of("basic", "lock")) <= 5000
    keys = _prefix_keys(r, prefix)
    assert key_of("basic", "lock") in keys
    for k in keys:
        assert k.startswith((prefix + "{basic}").encode())

    lock.release()
    assert lock.token is None
    assert lock.fence is None
    assert lock.remaining() is None
    assert lock.locked() is False
    assert lock.owned() is False
    assert lock.lost is False
    assert _prefix_keys(r, prefix) == {key_of("basic", "fence")}


@pytest.mark.timeout(30)
def test_tokens_are_random_and_fences_increase(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "seq", ttl=5)
    tokens: list[str] = []
    fences: list[int] = []
    for _ in range(20):
        assert lock.acquire(timeout=5)
        assert lock.token is not None and lock.fence is not None
        tokens.append(lock.token)
        fences.append(lock.fence)
        lock.release()
    assert len(set(tokens)) == len(tokens)
    assert all(a < b for a, b in itertools.pairwise(fences))
    other = redmutex.Lock(client, "seq", ttl=5)
    assert other.acquire(timeout=5)
    assert other.fence is not None and other.fence > fences[-1]
    assert other.token not in tokens
    other.release()


@pytest.mark.timeout(30)
def test_fence_is_per_name(client: redmutex.Client) -> None:
    a = redmutex.Lock(client, "fa", ttl=5)
    b = redmutex.Lock(client, "fb", ttl=5)
    for _ in range(3):
        a.acquire()
        a.release()
    b.acquire()
    a.acquire()
    # both are held at once: different names never block each other
    assert a.owned() and b.owned()
    assert a.fence is not None and b.fence is not None
    a.release()
    b.release()


@pytest.mark.timeout(30)
def test_no_other_keys_are_written(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    before = set(r.keys("*"))
    lock = redmutex.Lock(client, "only-these", ttl=5)
    lock.acquire()
    lock.extend(3)
    lock.owned()
    lock.locked()
    lock.release()
    with redmutex.Lock(client, "only-these", ttl=5):
        pass
    after = set(r.keys("*"))
    assert after - before == {key_of("only-these", "fence")}


@pytest.mark.timeout(30)
def test_remaining_and_extend(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "ext", ttl=1)
    lock.acquire()
    rem = lock.remaining()
    assert rem is not None and 0.0 < rem <= 1.0
    lock.extend(20)
    rem = lock.remaining()
    assert rem is not None and 18.0 < rem <= 20.0
    assert 18000 < r.pttl(key_of("ext", "lock")) <= 20000
    lock.extend(ttl=2.5)
    rem = lock.remaining()
    assert rem is not None and 1.5 < rem <= 2.5
    assert 1500 < r.pttl(key_of("ext", "lock")) <= 2500
    lock.extend()  # default: the lock's ttl
    rem = lock.remaining()
    assert rem is not None and 0.0 < rem <= 1.0
    assert 0 < r.pttl(key_of("ext", "lock")) <= 1000
    lock.extend(ttl=None)
    assert 0 < r.pttl(key_of("ext", "lock")) <= 1000
    assert lock.owned()
    lock.release()


@pytest.mark.timeout(30)
def test_extend_keeps_lock_past_original_ttl(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "keep", ttl=0.5)
    lock.acquire()
    for _ in range(4):
        time.sleep(0.25)
        lock.extend()
    assert lock.owned()
    assert lock.lost is False
    lock.release()


@pytest.mark.timeout(30)
def test_remaining_is_zero_after_local_deadline(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "zero", ttl=0.2)
    lock.acquire()
    time.sleep(0.5)
    assert lock.remaining() == 0.0
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    assert lock.owned() is False
    assert lock.remaining() is None


@pytest.mark.timeout(30)
def test_owned_is_checked_against_redis(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    lock = redmutex.Lock(client, "ext-del", ttl=30)
    lock.acquire()
    assert lock.owned()
    r.delete(key_of("ext-del", "lock"))
    assert lock.owned() is False
    assert lock.locked() is False


@pytest.mark.timeout(30)
def test_locked_sees_other_holders(client: redmutex.Client, other_client: redmutex.Client) -> None:
    mine = redmutex.Lock(client, "seen", ttl=10)
    theirs = redmutex.Lock(other_client, "seen", ttl=10)
    assert theirs.acquire(timeout=0)
    assert mine.locked() is True
    assert mine.owned() is False
    assert mine.token is None
    theirs.release()
    assert mine.locked() is False


# ------------------------------------------------------------------------------ with


@pytest.mark.timeout(30)
def test_with_binds_and_releases(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    lock = redmutex.Lock(client, "w", ttl=5)
    with lock as x:
        assert x is lock
        assert lock.owned()
        assert lock.token is not None
    assert not lock.owned()
    assert lock.token is None
    with redmutex.Lock(client, "w2", ttl=5) as y:
        assert isinstance(y, redmutex.Lock)
        assert y.owned()
    assert not y.locked()
    leftover = {k for k in _prefix_keys(r, prefix) if not k.endswith(b":fence")}
    assert leftover == set()


@pytest.mark.timeout(30)
def test_with_releases_when_block_raises(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "wr", ttl=5)
    with pytest.raises(ZeroDivisionError), lock:
        _ = 1 / 0
    assert not lock.locked()
    assert lock.token is None


@pytest.mark.timeout(30)
def test_with_raises_lock_timeout_error(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    holder = redmutex.Lock(other_client, "wt", ttl=20)
    holder.acquire()
    waiter = redmutex.Lock(client, "wt", ttl=5, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(redmutex.LockTimeoutError), waiter:
        pytest.fail("the block must not run")
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 3.0
    # a LockTimeoutError is a TimeoutError as well
    t0 = time.monotonic()
    with pytest.raises(TimeoutError), redmutex.Lock(client, "wt", timeout=0):
        pass
    assert time.monotonic() - t0 < 2.0
    assert holder.owned()
    holder.release()


@pytest.mark.timeout(30)
def test_lock_reusable_after_with(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "reuse", ttl=5)
    fences = []
    for _ in range(3):
        with lock:
            fences.append(lock.fence)
    assert all(isinstance(f, int) for f in fences)
    assert fences == sorted(fences) and len(set(fences)) == 3


# ------------------------------------------------------------------- timeouts / blocking


@pytest.fixture
def held(other_client: redmutex.Client) -> Iterator[redmutex.Lock]:
    """The lock named "busy", held by another client for 30 s."""
    holder = redmutex.Lock(other_client, "busy", ttl=30)
    assert holder.acquire(timeout=5)
    try:
        yield holder
    finally:
        if holder.token is not None:
            try:
                holder.release()
            except redmutex.LockError:
                pass


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.monotonic()
    result = fn()
    return result, time.monotonic() - t0


@pytest.mark.timeout(30)
def test_constructor_timeout_zero_tries_once(client: redmutex.Client, held: redmutex.Lock) -> None:
    lock = redmutex.Lock(client, "busy", timeout=0)
    result, elapsed = _timed(lock.acquire)
    assert result is False
    assert elapsed < 1.0
    assert lock.token is None and lock.fence is None


@pytest.mark.timeout(30)
def test_constructor_timeout_is_default_of_acquire(
    client: redmutex.Client, held: redmutex.Lock
) -> None:
    lock = redmutex.Lock(client, "busy", timeout=0.4)
    result, elapsed = _timed(lock.acquire)
    assert result is False
    assert 0.35 <= elapsed < 3.0
    # timeout=None means "the constructor's default", not "forever"
    result, elapsed = _timed(lambda: lock.acquire(timeout=None))
    assert result is False
    assert 0.35 <= elapsed < 3.0


@pytest.mark.timeout(30)
def test_acquire_timeout_overrides_constructor(
    client: redmutex.Client, held: redmutex.Lock
) -> None:
    lock = redmutex.Lock(client, "busy", timeout=20)
    result, elapsed = _timed(lambda: lock.acquire(timeout=0))
    assert result is False
    assert elapsed < 1.0
    result, elapsed = _timed(lambda: lock.acquire(timeout=0.3))
    assert result is False
    assert 0.25 <= elapsed < 3.0
    result, elapsed = _timed(lambda: lock.acquire(True, 0.3))
    assert result is False
    assert 0.25 <= elapsed < 3.0


@pytest.mark.timeout(30)
def test_blocking_false(client: redmutex.Client, held: redmutex.Lock) -> None:
    lock = redmutex.Lock(client, "busy", timeout=20)
    result, elapsed = _timed(lambda: lock.acquire(blocking=False))
    assert result is False
    assert elapsed < 1.0
    result, elapsed = _timed(lambda: lock.acquire(False))
    assert result is False
    assert elapsed < 1.0
    result, _ = _timed(lambda: lock.acquire(blocking=False, timeout=None))
    assert result is False
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=0)
    free = redmutex.Lock(client, "free", timeout=20)
    assert free.acquire(blocking=False) is True
    free.release()


def _release_later(lock: redmutex.Lock, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, lock.release)
    timer.daemon = True
    timer.start()
    return timer


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["default-none", "ctor-inf", "acquire-inf", "ctor0-acquire-inf"])
def test_waiting_forever(client: redmutex.Client, held: redmutex.Lock, how: str) -> None:
    if how == "default-none":
        lock = redmutex.Lock(client, "busy")
        call: Callable[[], object] = lock.acquire
    elif how == "ctor-inf":
        lock = redmutex.Lock(client, "busy", timeout=math.inf)
        call = lock.acquire
    elif how == "acquire-inf":
        lock = redmutex.Lock(client, "busy", timeout=0.1)
        call = lambda: lock.acquire(timeout=math.inf)
    else:
        lock = redmutex.Lock(client, "busy", timeout=0)
        call = lambda: lock.acquire(timeout=float("inf"))
    timer = _release_later(held, 1.5)
    result, elapsed = _timed(call)
    timer.join(5)
    assert result is True
    assert elapsed >= 1.0
    assert lock.owned()
    lock.release()


# ------------------------------------------------------------------ ownership rules


@pytest.mark.timeout(30)
def test_not_reentrant(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "re", ttl=10)
    assert lock.acquire()
    token, fence = lock.token, lock.fence
    for call in (
        lock.acquire,
        lambda: lock.acquire(timeout=0),
        lambda: lock.acquire(blocking=False),
        lambda: lock.acquire(timeout=1),
    ):
        t0 = time.monotonic()
        with pytest.raises(redmutex.LockError):
            call()
        assert time.monotonic() - t0 < 1.0
    with pytest.raises(redmutex.LockError), lock:
        pass
    # the original hold is untouched
    assert lock.token == token and lock.fence == fence
    assert lock.owned()
    lock.release()


@pytest.mark.timeout(30)
def test_acquire_while_acquiring_in_another_thread(
    client: redmutex.Client, held: redmutex.Lock
) -> None:
    lock = redmutex.Lock(client, "busy", ttl=10)
    waiter = _Thread(lambda: lock.acquire(timeout=15))
    waiter.start()
    time.sleep(0.5)
    with pytest.raises(redmutex.LockError):
        lock.acquire(timeout=0)
    held.release()
    assert waiter.outcome(15) is True
    assert lock.owned()
    lock.release()


@pytest.mark.timeout(60)
def test_two_threads_releasing_one_hold_release_it_once_and_lose_nothing(
    client: redmutex.Client,
) -> None:
    """Two threads call release() on one object at once: the hold is released once; the other
    call is told the object holds nothing (LockNotOwnedError, as threading.Lock refuses a second
    release), never LockLostError, and `lost` stays False. (Before, the second release went out
    with the same token and its "not ours" marked the hold lost, often failing both calls: in
    about 95 of 100 runs.)"""
    lock = redmutex.Lock(client, "two-releases", ttl=10)
    wrong = []
    for run in range(100):
        assert lock.acquire(timeout=5)
        start = threading.Barrier(2)

        def release(start: threading.Barrier = start) -> str:
            start.wait(timeout=10)
            try:
                lock.release()
                return "released"
            except redmutex.LockError as exc:
                return type(exc).__name__

        threads = [_Thread(release) for _ in range(2)]
        for thread in threads:
            thread.start()
        outcomes = sorted(thread.outcome(20) for thread in threads)
        if outcomes != ["LockNotOwnedError", "released"] or lock.lost:
            wrong.append((run, outcomes, lock.lost))
        assert not lock.locked()
    assert wrong == []


@pytest.mark.timeout(30)
def test_release_and_extend_without_hold(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "nh", ttl=5)
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.extend()
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.extend(3)
    lock.acquire()
    lock.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.extend()


@pytest.mark.timeout(30)
def test_non_owner_release_never_deletes(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    a = redmutex.Lock(client, "shared", ttl=10)
    b = redmutex.Lock(other_client, "shared", ttl=10)
    c = redmutex.Lock(client, "shared", ttl=10)  # same client, another object
    assert a.acquire()
    assert a.token is not None
    for obj in (b, c):
        with pytest.raises(redmutex.LockNotOwnedError):
            obj.release()
        with pytest.raises(redmutex.LockNotOwnedError):
            obj.extend()
        assert obj.acquire(timeout=0) is False
        assert obj.owned() is False
    assert r.get(key_of("shared", "lock")) == a.token.encode()
    assert a.owned()
    a.release()


@pytest.mark.timeout(30)
def test_expired_lease_then_taken_by_another(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    a = redmutex.Lock(client, "taken", ttl=0.3)
    b = redmutex.Lock(other_client, "taken", ttl=10)
    assert a.acquire()
    time.sleep(0.6)
    assert b.acquire(timeout=0)
    assert b.token is not None
    with pytest.raises(redmutex.LockLostError):
        a.extend()
    assert a.lost is True
    with pytest.raises(redmutex.LockError):  # lost or not owned, but never a delete
        a.release()
    assert r.get(key_of("taken", "lock")) == b.token.encode()
    assert b.owned()
    assert a.owned() is False
    b.release()


@pytest.mark.timeout(30)
def test_overwritten_token_is_never_deleted(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    lock = redmutex.Lock(client, "ow", ttl=10)
    lock.acquire()
    foreign = b"f" * 32
    r.set(key_of("ow", "lock"), foreign, px=10000)
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    assert lock.lost is True
    assert lock.owned() is False
    assert r.get(key_of("ow", "lock")) == foreign
    r.delete(key_of("ow", "lock"))


@pytest.mark.timeout(30)
def test_lost_on_release(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "lost", ttl=0.2)
    assert lock.acquire()
    time.sleep(0.6)
    assert lock.lost is False  # nothing has looked yet
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    assert lock.lost is True
    assert lock.token is None
    assert lock.remaining() is None
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.release()
    # a new hold starts with lost == False
    assert lock.acquire()
    assert lock.lost is False
    lock.release()
    assert r.exists(key_of("lost", "lock")) == 0


@pytest.mark.timeout(30)
def test_lost_on_extend(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "lost-ext", ttl=0.2)
    assert lock.acquire()
    time.sleep(0.6)
    with pytest.raises(redmutex.LockLostError):
        lock.extend(5)
    assert lock.lost is True
    assert r.exists(key_of("lost-ext", "lock")) == 0  # extend did not resurrect it


@pytest.mark.timeout(30)
def test_lost_on_external_delete(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "lost-del", ttl=30)
    assert lock.acquire()
    r.delete(key_of("lost-del", "lock"))
    with pytest.raises(redmutex.LockLostError):
        lock.extend()
    assert lock.lost is True


@pytest.mark.timeout(30)
def test_acquire_after_a_loss_says_so(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    """An object whose hold was found lost keeps it until its release tells the loss: acquire
    says so, instead of claiming the object still holds the lock; after the release it
    acquires again."""
    lock = redmutex.Lock(client, "lost-again", ttl=30)
    assert lock.acquire()
    r.delete(key_of("lost-again", "lock"))
    with pytest.raises(redmutex.LockLostError):
        lock.extend()
    with pytest.raises(redmutex.LockError, match="was lost and is not released yet") as info:
        lock.acquire(blocking=False)
    assert "already holds" not in str(info.value)
    with pytest.raises(redmutex.LockLostError):
        lock.release()
    assert lock.acquire(blocking=False) and lock.lost is False
    lock.release()


@pytest.mark.timeout(30)
def test_with_lost_lease_raises_on_exit(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "wl", ttl=0.2)
    with pytest.raises(redmutex.LockLostError, match="lock was lost"), lock:
        time.sleep(0.6)
    assert lock.lost is True
    assert lock.token is None
    assert not lock.locked()


@pytest.mark.timeout(30)
def test_with_lost_lease_and_block_error(
    client: redmutex.Client, caplog: pytest.LogCaptureFixture
) -> None:
    lock = redmutex.Lock(client, "wle", ttl=0.2)

    class Boom(Exception):
        pass

    with caplog.at_level(logging.WARNING, logger="redmutex"), pytest.raises(Boom), lock:
        time.sleep(0.6)
        raise Boom("from the block")
    warnings = [
        rec
        for rec in caplog.records
        if rec.levelno == logging.WARNING
        and (rec.name == "redmutex" or rec.name.startswith("redmutex."))
    ]
    assert warnings, f"no WARNING on the redmutex logger; got {caplog.records!r}"
    assert lock.lost is True


@pytest.mark.timeout(30)
def test_with_block_error_no_loss_no_warning(
    client: redmutex.Client, caplog: pytest.LogCaptureFixture
) -> None:
    lock = redmutex.Lock(client, "wnl", ttl=10)
    with caplog.at_level(logging.WARNING, logger="redmutex"), pytest.raises(KeyError), lock:
        raise KeyError("x")
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert lock.lost is False


# ------------------------------------------------------------------------------ names


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name",
    [
        "a\x00b",
        "\x00",
        "{",
        "}",
        "}{",
        "{inner}",
        "a:b:lock",
        "*?[]\\",
        " ",
        "\n\t",
        "ключ-🔒-鍵",
        "\U0010ffff",
        "x" * 100_000,
    ],
    ids=lambda n: repr(n)[:20],
)
def test_binary_ish_names(
    client: redmutex.Client, r: redis.Redis, prefix: str, key_of: KeyOf, name: str
) -> None:
    lock = redmutex.Lock(client, name, ttl=10)
    assert lock.acquire(timeout=5)
    assert lock.token is not None
    assert r.get(key_of(name, "lock")) == lock.token.encode()
    head = (prefix + "{" + name + "}").encode("utf-8")
    for k in _prefix_keys(r, prefix):
        assert k.startswith(head)
    other = redmutex.Lock(client, name, ttl=10)
    assert other.acquire(timeout=0) is False
    assert other.locked()
    lock.release()
    assert _prefix_keys(r, prefix) == {key_of(name, "fence")}


@pytest.mark.timeout(30)
def test_names_differing_after_nul_are_distinct(client: redmutex.Client) -> None:
    a = redmutex.Lock(client, "a\x00b", ttl=10)
    b = redmutex.Lock(client, "a\x00c", ttl=10)
    c = redmutex.Lock(client, "a", ttl=10)
    assert a.acquire(timeout=0)
    assert b.acquire(timeout=0)
    assert c.acquire(timeout=0)
    for lk in (a, b, c):
        lk.release()


@pytest.mark.parametrize("name", ["\ud800", "a\udfffb", "\udc80" * 3])
def test_lone_surrogate_name(client: redmutex.Client, name: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        redmutex.Lock(client, name)
    assert "name" in str(excinfo.value).lower()


# Ids the same in every process (an object's repr has its address): pytest-xdist compares them.
@pytest.mark.parametrize(
    "name",
    [b"bytes", 1, None, 1.5, ["x"], object()],
    ids=lambda v: "object()" if type(v) is object else repr(v),
)
def test_non_str_name(client: redmutex.Client, name: object) -> None:
    with pytest.raises(TypeError) as excinfo:
        redmutex.Lock(client, name)  # type: ignore[arg-type]
    assert "name" in str(excinfo.value).lower()


def test_empty_name(client: redmutex.Client) -> None:
    with pytest.raises(ValueError) as excinfo:
        redmutex.Lock(client, "")
    assert "name" in str(excinfo.value).lower()


# ------------------------------------------------------------------------------ waking


@pytest.mark.timeout(60)
def test_waiter_wakes_promptly_on_release(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    delays: list[float] = []
    for i in range(3):
        holder = redmutex.Lock(other_client, "wake", ttl=30)
        assert holder.acquire(timeout=5)
        waiter = redmutex.Lock(client, "wake", ttl=30)
        th = _Thread(lambda w=waiter: w.acquire(timeout=20))
        th.start()
        time.sleep(0.3 + 0.2 * i)  # let it settle into waiting
        assert th.is_alive(), "waiter returned while the lock was held"
        released_at = time.monotonic()
        holder.release()
        assert th.outcome(20) is True
        assert th.finished_at is not None
        delays.append(th.finished_at - released_at)
        assert waiter.owned()
        waiter.release()
    assert max(delays) < 1.0, delays


@pytest.mark.timeout(60)
def test_waiter_in_same_client_wakes_promptly(client: redmutex.Client) -> None:
    holder = redmutex.Lock(client, "wake2", ttl=30)
    holder.acquire()
    waiters = [redmutex.Lock(client, "wake2", ttl=30) for _ in range(4)]
    threads = [_Thread(lambda w=w: w.acquire(timeout=30)) for w in waiters]
    for th in threads:
        th.start()
    time.sleep(0.5)
    t_release = time.monotonic()
    holder.release()
    # hand the lock on, one waiter after another, each releasing at once
    got = 0
    deadline = time.monotonic() + 20
    while got < 4 and time.monotonic() < deadline:
        for w, th in zip(waiters, threads):
            if th.finished_at is not None and w.token is not None:
                assert th.outcome(1) is True
                got += 1
                w.release()
        time.sleep(0.005)
    for th in threads:
        assert th.outcome(5) is True
    assert time.monotonic() - t_release < 4.0


@pytest.mark.timeout(60)
def test_waiter_gets_expired_lock_after_ttl_not_before(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    ttl = 1.5
    holder = redmutex.Lock(other_client, "exp", ttl=ttl)
    t_before = time.monotonic()
    assert holder.acquire()
    waiter = redmutex.Lock(client, "exp", ttl=10)
    assert waiter.acquire(timeout=10) is True
    t_got = time.monotonic()
    assert t_got - t_before >= ttl - 0.01
    assert t_got - t_before < ttl + 1.5
    waiter.release()


@pytest.mark.timeout(60)
def test_waiter_gets_lock_of_foreign_dead_holder_after_expiry(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    # a holder that vanished without releasing: only the owner key with its PX is left
    t_before = time.monotonic()
    r.set(key_of("dead", "lock"), b"0" * 32, px=1200)
    waiter = redmutex.Lock(client, "dead", ttl=10)
    assert waiter.acquire(timeout=10) is True
    t_got = time.monotonic()
    assert t_got - t_before >= 1.2 - 0.01
    assert t_got - t_before < 1.2 + 1.5
    waiter.release()


HOLDER_SCRIPT = r"""
import sys, time, redmutex
url, prefix, name, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
c = redmutex.Client(url, prefix=prefix)
lock = redmutex.Lock(c, name, ttl=ttl)
t0 = time.monotonic()
assert lock.acquire(timeout=10)
print(repr(t0), flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
def test_killed_holder_frees_lock_after_ttl(
    client: redmutex.Client, redis_url: str, prefix: str, procs: PyProcs
) -> None:
    ttl = 2.0
    proc = procs.start(HOLDER_SCRIPT, redis_url, prefix, "killed", str(ttl))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"holder failed: {proc.stderr.read() if proc.stderr else ''}"
    t_holder = float(line)  # CLOCK_MONOTONIC is shared by all processes of the host
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    waiter = redmutex.Lock(client, "killed", ttl=10)
    assert waiter.acquire(timeout=15) is True
    t_got = time.monotonic()
    assert t_got - t_holder >= ttl - 0.01
    assert t_got - t_holder < ttl + 2.0
    waiter.release()


@pytest.mark.timeout(60)
def test_waiting_does_not_poll(make_server: Callable[..., RedisServer]) -> None:
    server = make_server()
    watcher = redis.Redis(host="127.0.0.1", port=server.port)
    holder_client = redmutex.Client(server.url, prefix="np:")
    waiter_client = redmutex.Client(server.url, prefix="np:")
    try:
        holder = redmutex.Lock(holder_client, "quiet", ttl=60)
        assert holder.acquire()
        waiters = [redmutex.Lock(waiter_client, "quiet", ttl=10) for _ in range(4)]
        threads = [_Thread(lambda w=w: w.acquire(timeout=4)) for w in waiters]
        for th in threads:
            th.start()
        time.sleep(1.0)  # past the first attempts and the subscription
        before = _calls(watcher)
        time.sleep(2.5)
        during = _delta(before, _calls(watcher))
        for th in threads:
            assert th.outcome(10) is False
        # A timer-driven poll would show up as dozens of script calls in 2.5 s. The one waiter of
        # the process that holds a place in the queue (an unfair lock's waiters queue) refreshes
        # it every 0.67 s: 4 scripts, one more on a slow machine, each of them a refresh (HSET of the place's record).
        scripts = during.get("evalsha", 0)
        assert scripts <= 5, f"{during} while waiting on a lock that was never released"
        assert during.get("hset", 0) == scripts, during
        holder.release()
    finally:
        holder_client.close()
        waiter_client.close()
        watcher.close()


# ------------------------------------------------------------------------------ auto_renew


@pytest.mark.timeout(60)
def test_auto_renew_keeps_the_lease(client: redmutex.Client, r: redis.Redis, key_of: KeyOf) -> None:
    lock = redmutex.Lock(client, "renewed", ttl=1.5, auto_renew=True)
    assert lock.acquire()
    time.sleep(4.6)  # more than three leases
    assert lock.owned()
    assert 0 < r.pttl(key_of("renewed", "lock")) <= 1500
    assert lock.lost is False
    lock.release()
    assert r.exists(key_of("renewed", "lock")) == 0


@pytest.mark.timeout(60)
def test_auto_renew_in_with_block(client: redmutex.Client) -> None:
    with redmutex.Lock(client, "renewed-with", ttl=1.5, auto_renew=True) as lock:
        time.sleep(4.6)  # more than three leases
        assert lock.owned()
    assert lock.lost is False
    assert not lock.locked()


@pytest.mark.timeout(60)
def test_auto_renew_stops_after_release(make_server: Callable[..., RedisServer]) -> None:
    server = make_server()
    watcher = redis.Redis(host="127.0.0.1", port=server.port)
    c = redmutex.Client(server.url, prefix="ar:")
    try:
        lock = redmutex.Lock(c, "stops", ttl=1.5, auto_renew=True)  # renewed every 0.5 s
        assert lock.acquire()
        time.sleep(1.1)  # renewed twice
        lock.release()
        time.sleep(0.5)
        before = _commands_processed(watcher)
        time.sleep(2.0)  # four renewal periods
        assert _commands_processed(watcher) - before - 1 == 0
    finally:
        c.close()
        watcher.close()


@pytest.mark.timeout(60)
def test_auto_renew_reports_loss_once(
    client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    calls: list[object] = []
    called = threading.Event()

    def on_lost(lk: redmutex.Lock) -> None:
        calls.append(lk)
        called.set()

    lock = redmutex.Lock(client, "renew-lost", ttl=0.6, auto_renew=True, on_lost=on_lost)
    assert lock.acquire()
    r.delete(key_of("renew-lost", "lock"))
    assert called.wait(5), "on_lost was not called"
    assert lock.lost is True
    time.sleep(1.0)  # several more renewal periods
    assert calls == [lock]
    assert r.exists(key_of("renew-lost", "lock")) == 0  # renewal did not resurrect it
    with pytest.raises((redmutex.LockLostError, redmutex.LockNotOwnedError)):
        lock.release()


def _commands_processed(conn: redis.Redis) -> int:
    return int(conn.info("stats")["total_commands_processed"])


# ------------------------------------------------------------------------------ signals


class _Interrupted(Exception):
    pass


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted


@pytest.mark.timeout(60)
def test_signal_interrupts_blocked_acquire(
    client: redmutex.Client, held: redmutex.Lock, r: redis.Redis, key_of: KeyOf
) -> None:
    assert threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGUSR1, _raise_interrupted)
    try:
        lock = redmutex.Lock(client, "busy", ttl=10)
        timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGUSR1))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(_Interrupted):
            lock.acquire(timeout=30)
        elapsed = time.monotonic() - t0
        timer.join(5)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert 0.4 <= elapsed < 3.0
    assert lock.token is None
    # the interrupted acquire neither holds nor later takes the lock
    held.release()
    time.sleep(0.5)
    assert r.exists(key_of("busy", "lock")) == 0
    assert lock.owned() is False
    assert lock.acquire(timeout=0) is True  # and the object is usable again
    lock.release()


@pytest.mark.timeout(60)
def test_keyboard_interrupt_blocked_acquire(client: redmutex.Client, held: redmutex.Lock) -> None:
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        lock = redmutex.Lock(client, "busy", ttl=10)
        timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()  # timeout None: forever
        elapsed = time.monotonic() - t0
        timer.join(5)
    finally:
        signal.signal(signal.SIGINT, old)
    assert elapsed < 3.0
    assert lock.token is None


# ---------------------------------------------------------------------- mutual exclusion


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared_client", [True, False])
def test_mutual_exclusion_threads(redis_url: str, prefix: str, shared_client: bool) -> None:
    n_threads, n_iter = 8, 25
    clients = [redmutex.Client(redis_url, prefix=prefix) for _ in range(n_threads)]
    if shared_client:
        clients = [clients[0]] * n_threads
    state = {"counter": 0, "inside": 0, "overlaps": 0}
    fences: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def worker(i: int) -> None:
        try:
            lock = redmutex.Lock(clients[i], "mx", ttl=10, timeout=60)
            barrier.wait(30)
            for _ in range(n_iter):
                with lock:
                    state["inside"] += 1
                    if state["inside"] != 1:
                        state["overlaps"] += 1
                    assert lock.fence is not None
                    fences.append(lock.fence)
                    value = state["counter"]
                    time.sleep(0.001)
                    state["counter"] = value + 1
                    state["inside"] -= 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n_threads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(100)
        assert not any(t.is_alive() for t in threads)
    finally:
        for c in {id(x): x for x in clients}.values():
            c.close()
    assert errors == []
    assert state["overlaps"] == 0
    assert state["counter"] == n_threads * n_iter
    assert all(a < b for a, b in itertools.pairwise(fences))


MX_WORKER = r"""
import json, sys, time, redis, redmutex
url, prefix, n_iter = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = redmutex.Client(url, prefix=prefix)
r = redis.Redis.from_url(url)
counter_key = prefix + "counter"
lock = redmutex.Lock(c, "mxp", ttl=10, timeout=60)
spans = []
for _ in range(n_iter):
    with lock:
        t0 = time.monotonic()
        fence = lock.fence
        value = int(r.get(counter_key) or 0)
        time.sleep(0.002)
        r.set(counter_key, value + 1)
        t1 = time.monotonic()
    spans.append([t0, t1, fence])
c.close()
print(json.dumps(spans))
"""


@pytest.mark.timeout(180)
def test_mutual_exclusion_processes(
    redis_url: str, prefix: str, r: redis.Redis, procs: PyProcs
) -> None:
    n_procs, n_iter = 4, 25
    children = [procs.start(MX_WORKER, redis_url, prefix, str(n_iter)) for _ in range(n_procs)]
    spans: list[tuple[float, float, int]] = []
    for child in children:
        rc, out, err = procs.wait(child, timeout=150)
        assert rc == 0, err
        spans.extend((a, b, f) for a, b, f in json.loads(out))
    assert int(r.get(prefix + "counter") or 0) == n_procs * n_iter
    spans.sort()
    overlaps = sum(1 for x, y in itertools.pairwise(spans) if y[0] < x[1])
    assert overlaps == 0
    fences = [f for _, _, f in spans]
    assert all(a < b for a, b in itertools.pairwise(fences))


def test_acquire_takes_an_int_for_blocking_as_threading_does(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "int-blocking")
    other = redmutex.Lock(client, "int-blocking")
    assert lock.acquire(1)
    started = time.monotonic()
    assert other.acquire(0) is False  # tries once, as acquire(blocking=False)
    assert time.monotonic() - started < 2
    lock.release()
    with pytest.raises(TypeError, match="blocking"):
        lock.acquire("yes")  # type: ignore[arg-type]


def test_argument_messages_say_what_was_given(client: redmutex.Client) -> None:
    """A tiny negative timeout is written as Python writes it (it was 300 digits), and a
    type named like a builtin is qualified by its module."""
    with pytest.raises(ValueError, match=r"got -1e-300$"):
        redmutex.Lock(client, "msg", timeout=-1e-300)
    flag = type("bool", (), {"__module__": "numpy"})  # as numpy's bool_ is named
    with pytest.raises(TypeError, match=r"expected a bool, not numpy\.bool$"):
        redmutex.Lock(client, "msg").acquire(blocking=flag())
    with pytest.raises(TypeError, match=r"not str$"):
        redmutex.Lock(client, "msg").acquire(blocking="yes")  # type: ignore[arg-type]


def test_integer_arguments_of_other_types_are_taken(client: redmutex.Client) -> None:
    class Count:
        """An integer of another type (as numpy's), with __index__."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __index__(self) -> int:
            return self.n

    sem = redmutex.Semaphore(client, "index-limit", Count(2))  # type: ignore[arg-type]
    with sem:
        assert sem.holders() == 1
    lock = redmutex.Lock(client, "index-ttl", ttl=Count(5))  # type: ignore[arg-type]
    with lock:
        remaining = lock.remaining()
        assert remaining is not None and 3 < remaining <= 5
    with pytest.raises(TypeError, match="limit"):
        redmutex.Semaphore(client, "index-limit", 2.0)  # type: ignore[arg-type]
