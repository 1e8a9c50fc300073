"""redmutex.compat.redis_py: redis-py's Lock on redmutex's engine, against a real redis-server,
alone and mixed with plain redis-py processes (both directions)."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock
from _helpers import wake_delay
from redis.exceptions import LockError, LockNotOwnedError
from redmutex.compat import redis_py
from redmutex.compat.redis_py import Lock, _base, lock
from redmutex.compat.redis_py import asyncio as redis_py_aio


@pytest.fixture
def name() -> str:
    return f"rp-{uuid.uuid4().hex[:10]}"


def test_key_and_value_are_redis_pys(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=5)
    assert lk.acquire(blocking=False)
    token = lk.local.token
    assert isinstance(token, bytes) and len(token) == 32
    assert r.get(name) == token
    assert 4000 < r.pttl(name) <= 5000
    assert lk.locked() and lk.owned()
    assert isinstance(lk.fence, int)
    lk.release()
    assert r.get(name) is None
    assert not lk.locked() and not lk.owned() and lk.fence is None


def test_custom_token_and_str_name(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=5)
    assert lk.acquire(token="my-token")
    assert r.get(name) == b"my-token"
    assert lk.local.token == b"my-token"
    # A token already in place is not ours: SET NX semantics, as in redis-py.
    other = Lock(r, name, timeout=5)
    assert not other.acquire(blocking=False, token="my-token")
    lk.release()


def test_errors_are_redis_pys(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=5)
    with pytest.raises(LockError, match="not owned or is already unlocked") as info:
        lk.release()
    assert not isinstance(info.value, LockNotOwnedError)
    assert info.value.lock_name == name
    with pytest.raises(LockError, match="Cannot extend an unlocked lock"):
        lk.extend(1)
    with pytest.raises(LockError, match="Cannot reacquire an unlocked lock"):
        lk.reacquire()
    assert lk.acquire()
    r.delete(name)  # the lease is gone (expired, or deleted by an admin)
    with pytest.raises(LockNotOwnedError, match="extend a lock that's no longer owned"):
        lk.extend(1)
    with pytest.raises(LockNotOwnedError, match="reacquire a lock that's no longer owned"):
        lk.reacquire()
    with pytest.raises(LockNotOwnedError, match="release a lock that's no longer owned"):
        lk.release()
    # The token is cleared by the failed release, as in redis-py.
    assert lk.local.token is None
    no_timeout = Lock(r, name)
    assert no_timeout.acquire()
    with pytest.raises(LockError, match="extend a lock with no timeout"):
        no_timeout.extend(1)
    with pytest.raises(LockError, match="reacquire a lock with no timeout"):
        no_timeout.reacquire()
    no_timeout.release()


def test_extend_adds_unless_replace_and_reacquire_resets(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=2)
    assert lk.acquire()
    assert lk.extend(10) is True
    assert 11000 < r.pttl(name) <= 12000  # added to what was left
    assert lk.extend(3, replace_ttl=True) is True
    assert 2000 < r.pttl(name) <= 3000  # replaced
    assert lk.reacquire() is True
    assert 1000 < r.pttl(name) <= 2000  # back to timeout
    lk.release()


def test_extend_out_of_range_is_a_response_error_as_in_redis_py(r: redis.Redis, name: str) -> None:
    for make in (redis.lock.Lock, Lock):
        lk = make(r, f"{name}-{make.__module__}", timeout=2)
        assert lk.acquire()
        with pytest.raises(redis.exceptions.ResponseError):
            lk.extend(1e20)
        assert lk.owned()  # the lease is left as it was
        lk.release()


def test_lease_expires(r: redis.Redis, name: str) -> None:
    holder = Lock(r, name, timeout=0.3)
    assert holder.acquire()
    waiter = Lock(r, name, timeout=5, sleep=5)
    start = time.monotonic()
    assert waiter.acquire(blocking_timeout=5)
    took = time.monotonic() - start
    assert took < 2.0  # noticed at the lease's end, not after sleep=5
    with pytest.raises(LockNotOwnedError):
        holder.release()
    waiter.release()


def test_blocking_false_and_blocking_timeout(r: redis.Redis, name: str) -> None:
    holder = Lock(r, name, timeout=10)
    assert holder.acquire()
    assert not Lock(r, name, blocking=False).acquire()
    assert not Lock(r, name).acquire(blocking=False)
    start = time.monotonic()
    assert not Lock(r, name, blocking_timeout=0.3).acquire()
    assert 0.25 < time.monotonic() - start < 2.0
    with (
        pytest.raises(LockError, match="Unable to acquire lock"),
        Lock(r, name, blocking_timeout=0.1),
    ):
        pass
    holder.release()


def test_an_infinite_or_huge_blocking_timeout_waits_for_good_as_redis_pys(
    r: redis.Redis, name: str
) -> None:
    """redis-py waits until a deadline it never reaches; the shim raised ValueError
    ('timeout: out of range') for these."""
    for forever in (math.inf, 1e300):
        holder = Lock(r, name, timeout=10)
        assert holder.acquire()
        waiter = Lock(r, name, timeout=10, blocking_timeout=forever)
        delay = wake_delay(holder.release, waiter.acquire, waiter.release, settle=0.3, timeout=10)
        assert delay < 5
        again = Lock(r, name, timeout=10)
        assert again.acquire(blocking_timeout=forever)
        again.release()


def test_waiter_is_woken_by_a_shim_release_not_by_polling(
    r: redis.Redis, r2: redis.Redis, name: str
) -> None:
    holder = Lock(r, name, timeout=10)
    assert holder.acquire()
    # sleep=5: a polling waiter would take up to 5 s after the release.
    waiter = Lock(r2, name, timeout=10, sleep=5)
    delay = wake_delay(
        holder.release, lambda: waiter.acquire(blocking_timeout=20), settle=0.5, timeout=10
    )
    assert delay < 1.0


def test_no_timeout_is_a_renewed_lease(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name)  # redis-py: no expiry
    assert lk.acquire()
    assert 0 < r.pttl(name) <= 10_000
    lk.release()
    assert r.get(name) is None


@pytest.mark.timeout(30)
def test_a_token_released_elsewhere_and_taken_again_with_a_timeout_expires(
    r: redis.Redis, r2: redis.Redis, name: str
) -> None:
    """As python-redis-lock's shim: a no-timeout hold of token T1 released by another process
    (redis-py's do_release) and taken again here with timeout=1 just before the old renewal's
    tick is not kept alive by that renewal."""
    first = Lock(r, name)
    started = time.monotonic()
    assert first.acquire(token="T1")
    time.sleep(max(0.0, started + 2.8 - time.monotonic()))
    redis.lock.Lock(r2, name).do_release(b"T1")
    again = Lock(r, name, timeout=1)
    assert again.acquire(blocking=False, token="T1")
    time.sleep(max(0.0, started + 5.0 - time.monotonic()))  # past the tick and the expiry
    assert r.exists(name) == 0


def test_thread_local_tokens(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=5)
    assert lk.acquire()
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(lk.local.token))
    t.start()
    t.join()
    assert seen == [None]  # another thread does not see this thread's token
    lk.release()
    shared = Lock(r, name, timeout=5, thread_local=False)
    assert shared.acquire()
    t = threading.Thread(target=shared.release)  # released by a worker thread
    t.start()
    t.join()
    assert r.get(name) is None


def test_with_and_raise_on_release_error(
    r: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Lock(r, name, timeout=5) as lk:
        assert lk.owned()
    assert r.get(name) is None
    with pytest.raises(LockNotOwnedError), Lock(r, name, timeout=5):
        r.delete(name)
    with Lock(r, name, timeout=5, raise_on_release_error=False):
        r.delete(name)
    assert "no longer owned when exiting" in caplog.text


def test_lock_function_mirrors_redis_lock(r: redis.Redis, name: str) -> None:
    lk = lock(
        r,
        name,
        timeout=3,
        sleep=0.2,
        blocking=False,
        blocking_timeout=1,
        thread_local=False,
        raise_on_release_error=False,
    )
    assert isinstance(lk, Lock)
    assert (
        lk.timeout,
        lk.sleep,
        lk.blocking,
        lk.blocking_timeout,
        lk.thread_local,
        lk.raise_on_release_error,
    ) == (3, 0.2, False, 1, False, False)

    class Mine(Lock):
        pass

    assert type(lock(r, name, lock_class=Mine)) is Mine
    assert redis_py.LockError is LockError


def test_do_hooks(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, timeout=5)
    assert lk.do_acquire(b"tok")
    assert not Lock(r, name).do_acquire(b"other")
    lk.local.token = b"tok"  # as redis-py's acquire() does after its do_acquire()
    assert lk.do_extend(1, True) is True
    assert 0 < r.pttl(name) <= 1000
    assert lk.do_reacquire() is True
    lk.do_release(b"tok")
    with pytest.raises(LockNotOwnedError):
        lk.do_release(b"tok")


# -- mixed fleet: plain redis-py and the shim on one lock -------------------------------------


def test_mixed_mutual_exclusion_both_directions(r: redis.Redis, r2: redis.Redis, name: str) -> None:
    original = redis.lock.Lock(r2, name, timeout=5)
    shim = Lock(r, name, timeout=5)
    assert original.acquire(blocking=False)
    assert not shim.acquire(blocking=False)
    original.release()
    assert shim.acquire(blocking=False)
    assert not original.acquire(blocking=False)
    assert not original.owned() and shim.owned()
    shim.release()
    assert original.acquire(blocking=False)
    original.release()


def test_shim_waiter_notices_an_original_release_within_sleep(
    r: redis.Redis, r2: redis.Redis, name: str
) -> None:
    # A 30 s lease: without looking again every `sleep`, the waiter would sleep until it ends.
    original = redis.lock.Lock(r2, name, timeout=30)
    assert original.acquire()
    waiter = Lock(r, name, timeout=5, sleep=0.1)
    delay = wake_delay(
        original.release, lambda: waiter.acquire(blocking_timeout=20), settle=0.5, timeout=10
    )
    assert delay < 2.5  # looked again (every 0.1 s), not at the 30 s lease end


def test_original_waiter_gets_a_shim_release(r: redis.Redis, r2: redis.Redis, name: str) -> None:
    shim = Lock(r, name, timeout=5)
    assert shim.acquire()
    original = redis.lock.Lock(r2, name, timeout=5, sleep=0.05)
    delay = wake_delay(shim.release, lambda: original.acquire(blocking_timeout=20), timeout=10)
    assert delay < 2.5  # the release freed the key at once, not at the 5 s lease end
    r.delete(name)


def test_mixed_counter_is_never_raced(r: redis.Redis, r2: redis.Redis, name: str) -> None:
    """Threads on plain redis-py and on the shim increment a counter under the lock."""
    counter = f"{name}:n"
    inside = [0]
    overlaps = [0]
    stop_at = time.monotonic() + 4.0

    def work(make: object, rounds: int) -> None:
        for _ in range(rounds):
            if time.monotonic() > stop_at:
                return
            lk = make()  # type: ignore[operator]
            assert lk.acquire(blocking_timeout=10)
            inside[0] += 1
            if inside[0] > 1:
                overlaps[0] += 1
            r.incr(counter)
            inside[0] -= 1
            lk.release()

    threads = [
        threading.Thread(
            target=work, args=(lambda: redis.lock.Lock(r2, name, timeout=5, sleep=0.01), 30)
        ),
        threading.Thread(target=work, args=(lambda: Lock(r, name, timeout=5, sleep=0.01), 30)),
        threading.Thread(target=work, args=(lambda: Lock(r, name, timeout=5, sleep=0.01), 30)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert overlaps[0] == 0
    assert int(r.get(counter) or 0) > 10


@pytest.mark.parametrize("make", [redis.lock.Lock, Lock], ids=["redis-py", "shim"])
@pytest.mark.parametrize("timeout", [0, None])
def test_do_extend_of_a_lock_without_expiry_is_refused_as_in_redis_py(
    r: redis.Redis, name: str, make: type, timeout: int | None
) -> None:
    """A falsy timeout is no expiry in redis-py: its extend script finds no TTL and answers
    LockNotOwnedError (extend() with timeout=0, do_extend() with either). The shim checked
    `timeout is None` only and extended the renewed lease it keeps instead (an audit)."""
    lk = make(r, name, timeout=timeout)
    assert lk.acquire()
    if timeout == 0:
        with pytest.raises(LockNotOwnedError, match="extend a lock that's no longer owned"):
            lk.extend(5)
    with pytest.raises(LockNotOwnedError, match="extend a lock that's no longer owned"):
        lk.do_extend(5, False)
    assert lk.owned()
    lk.release()


@pytest.mark.parametrize("timeout", [0, None])
def test_do_reacquire_of_a_lock_without_expiry_is_refused(
    r: redis.Redis, name: str, timeout: int | None
) -> None:
    """redis-py's reacquire() with timeout=0 sends PEXPIRE 0, which deletes the lock, and
    answers True; the shim deleted its renewed lease the same way. It refuses as reacquire()
    refuses timeout=None."""
    lk = Lock(r, name, timeout=timeout)
    assert lk.acquire()
    if timeout == 0:
        with pytest.raises(LockError, match="reacquire a lock with no timeout"):
            lk.reacquire()
    with pytest.raises(LockError, match="reacquire a lock with no timeout"):
        lk.do_reacquire()
    assert lk.owned()
    lk.release()


@pytest.mark.parametrize("make", [redis.lock.Lock, Lock], ids=["redis-py", "shim"])
def test_do_acquire_only_takes_the_key(r: redis.Redis, name: str, make: type) -> None:
    """redis-py's do_acquire() is the SET alone: acquire() sets local.token after it. The
    shim's set the token too (and replaced the object's hold)."""
    lk = make(r, name, timeout=5)
    assert lk.do_acquire(b"tok")
    assert r.get(name) == b"tok"
    assert lk.local.token is None
    assert not lk.owned()
    with pytest.raises(LockError, match="not owned or is already unlocked"):
        lk.release()
    lk.local.token = b"tok"
    lk.release()
    assert r.exists(name) == 0


def test_a_no_timeout_hold_taken_by_do_acquire_is_renewed_until_released(
    r: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_base, "NO_EXPIRY_LEASE", 0.6)
    lk = Lock(r, name)
    assert lk.do_acquire(b"tok")
    time.sleep(2.0)  # over three leases
    assert r.get(name) == b"tok"
    lk.do_release(b"tok")
    time.sleep(0.7)
    assert r.exists(name) == 0


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "asyncio"])
def test_an_empty_name_is_refused(r: redis.Redis, aio: bool) -> None:
    """redis-py takes `r.lock("")` (the key ""); the shim names redmutex's keys beside the lock
    after it, and the engine refuses an empty name (docs/compat.md lists the difference)."""
    make = redis_py_aio.lock if aio else lock
    with pytest.raises(ValueError, match="must not be empty"):
        make(r, "", timeout=5)


# -- found by the differential audit against redis-py (each runs on redis-py's Lock as well) --


@pytest.mark.parametrize("lock_class", [Lock, redis.lock.Lock], ids=["shim", "redis-py"])
def test_a_str_token_set_in_local_extends_reacquires_and_releases(
    r: redis.Redis, name: str, lock_class: Any
) -> None:
    """redis-py sends whatever ``local.token`` holds, so a token kept as text elsewhere (a job's
    record, a decode_responses reply) and set there works for every call; the shim's extend and
    reacquire raised AttributeError ('str' object has no attribute 'decode')."""
    holder = lock_class(r, name, timeout=5)
    assert holder.acquire(token="job-42")
    lk = lock_class(r, name, timeout=5)
    lk.local.token = "job-42"
    assert lk.extend(5) is True
    assert 9000 < r.pttl(name) <= 10000
    assert lk.reacquire() is True
    assert 4000 < r.pttl(name) <= 5000
    lk.release()
    assert r.get(name) is None


def test_the_scripts_are_redis_pys(r: redis.Redis, redis_url: str, name: str) -> None:
    """Code that reads ``Lock.LUA_*_SCRIPT`` or runs the registered ``lua_*`` scripts itself
    (a subclass, a maintenance tool) finds redis-py's; the shim had none of them."""
    for attr in ("LUA_RELEASE_SCRIPT", "LUA_EXTEND_SCRIPT", "LUA_REACQUIRE_SCRIPT"):
        assert getattr(Lock, attr) == getattr(redis.lock.Lock, attr)
        assert getattr(redis_py_aio.Lock, attr) == getattr(redis.asyncio.lock.Lock, attr)
    ar = redis.asyncio.Redis.from_url(redis_url)
    alk = redis_py_aio.Lock(ar, name, timeout=5)
    for lk in (Lock(r, name, timeout=5), alk):
        assert callable(lk.register_scripts)
        for script in ("lua_release", "lua_extend", "lua_reacquire"):
            assert getattr(lk, script) is not None
    lk = Lock(r, name, timeout=5)
    assert lk.acquire()
    assert lk.lua_extend(keys=[name], args=[lk.local.token, 5000, "0"], client=r) == 1
    assert 9000 < r.pttl(name) <= 10000
    assert lk.lua_release(keys=[name], args=[lk.local.token], client=r) == 1
    assert r.get(name) is None


@pytest.mark.parametrize("lock_class", [Lock, redis.lock.Lock], ids=["shim", "redis-py"])
def test_the_exit_warning_is_on_redis_pys_logger(
    r: redis.Redis, name: str, lock_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A program that set redis-py's ``redis.lock`` logger's level (or handler) keeps it: the
    shim logged on ``redmutex.compat.redis_py`` instead."""
    lk = lock_class(r, name, timeout=5, raise_on_release_error=False)
    with caplog.at_level(logging.WARNING, logger="redis.lock"), lk:
        lk.release()
    assert [(rec.name, rec.levelno) for rec in caplog.records] == [("redis.lock", logging.WARNING)]


@pytest.mark.parametrize("timeout", [-1, -0.5, 0.0004])
@pytest.mark.parametrize("lock_class", [Lock, redis.lock.Lock], ids=["shim", "redis-py"])
def test_a_timeout_redis_refuses_is_redis_pys_response_error_at_acquire(
    r: redis.Redis, name: str, lock_class: Any, timeout: float
) -> None:
    """redis-py sends ``int(timeout * 1000)`` as SET's PX; a negative or sub-millisecond
    timeout is Redis' ResponseError at acquire, and nothing is taken. The shim raised
    ValueError for a negative one and took a sub-millisecond lease."""
    lk = lock_class(r, name, timeout=timeout)
    with pytest.raises(redis.exceptions.ResponseError, match="invalid expire time"):
        lk.acquire(blocking=False)
    with pytest.raises(redis.exceptions.ResponseError, match="invalid expire time"):
        lk.do_acquire("tok")
    assert r.exists(name) == 0 and lk.local.token is None
    assert lock_class(r, name, timeout=2.9999).acquire()
    assert 2000 < r.pttl(name) <= 2999  # redis-py's whole milliseconds


@pytest.mark.parametrize("lock_class", [Lock, redis.lock.Lock], ids=["shim", "redis-py"])
def test_sleep_is_only_read_when_the_acquire_must_wait(
    r: redis.Redis, name: str, lock_class: Any
) -> None:
    """redis-py reads ``sleep`` only once an attempt failed and it is to wait: ``sleep=None``
    takes a free lock, and a busy one is False without blocking, TypeError with. The shim
    raised TypeError before its first attempt."""
    lk = lock_class(r, name, timeout=5, sleep=None)
    assert lk.acquire()
    other = lock_class(r, name, timeout=5, sleep=None)
    assert other.acquire(blocking=False) is False
    t0 = time.monotonic()
    with pytest.raises(TypeError):
        other.acquire(blocking_timeout=5)
    assert time.monotonic() - t0 < 2
    assert other.local.token is None
    lk.release()
    assert r.exists(name) == 0
