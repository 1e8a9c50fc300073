"""redmutex.compat.redis_lock: python-redis-lock's Lock on redmutex's engine, against a real
redis-server, alone and mixed with python-redis-lock itself (both directions)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pytest
import redis
import redis_lock as original_redis_lock
from _helpers import wake_delay
from redmutex.compat import redis_lock
from redmutex.compat.redis_lock import (
    AlreadyAcquired,
    AlreadyStarted,
    InvalidTimeout,
    Lock,
    NotAcquired,
    NotExpirable,
    TimeoutNotUsable,
    TimeoutTooLarge,
    reset_all,
)


@pytest.fixture
def name() -> str:
    return f"rl-{uuid.uuid4().hex[:10]}"


def test_keys_values_and_signal(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, expire=5, id="my-id")
    assert lk.id == "my-id"
    assert lk.acquire()
    assert r.get(f"lock:{name}") == b"my-id"
    assert 4000 < r.pttl(f"lock:{name}") <= 5000
    assert lk.locked() and lk.get_owner_id() == "my-id"
    assert isinstance(lk.fence, int)
    lk.release()
    assert r.get(f"lock:{name}") is None
    # The release pushed python-redis-lock's signal, which then expires (signal_expire ms).
    assert r.lrange(f"lock-signal:{name}", 0, -1) == [b"1"]
    assert 0 < r.pttl(f"lock-signal:{name}") <= 1000
    assert not lk.locked() and lk.get_owner_id() is None


def test_default_ids_like_the_original(r: redis.Redis, name: str) -> None:
    a, b = Lock(r, name), Lock(r, name)
    assert a.id != b.id and len(a.id) == 24  # base64 of 18 random bytes
    assert Lock(r, name, id=b"\xff\xfe").id == "//4="
    assert Lock(r, name, id=b"abc").id == "abc"
    with pytest.raises(TypeError, match="Incorrect type for `id`"):
        Lock(r, name, id=5)  # type: ignore[arg-type]


def test_constructor_checks(r: redis.Redis, name: str) -> None:
    with pytest.raises(ValueError, match="StrictRedis"):
        Lock(object(), name)
    with pytest.raises(ValueError, match="auto_renewal"):
        Lock(r, name, auto_renewal=True)
    with pytest.raises(ValueError, match="negative expire"):
        Lock(r, name, expire=-1)


def test_sub_second_expire_is_refused_and_extend_never_deletes(r: redis.Redis, name: str) -> None:
    # python-redis-lock counts whole seconds: int(0.5) is 0, which Redis refuses at acquire.
    with pytest.raises(redis.ResponseError, match="invalid expire"):
        original_redis_lock.Lock(r, name + "-orig", expire=0.5).acquire()
    for expire in (0.5, 0.999, -0.5):
        with pytest.raises(ValueError, match="expire"):
            Lock(r, name, expire=expire)
        with pytest.raises(ValueError, match="expire"):
            Lock(r, name, expire=expire, auto_renewal=True)
    # A falsy expire (0, 0.0, None) is no expiry, as in the original (which then fails on
    # auto_renewal too).
    with pytest.raises(ValueError, match="expire"):
        Lock(r, name, expire=0, auto_renewal=True)
    for falsy in (0, 0.0, None):
        forever = Lock(r, name, expire=falsy)
        assert forever.acquire()
        with pytest.raises(NotExpirable):
            forever.extend(5)
        forever.release()
    lk = Lock(r, name, expire=2)
    assert lk.acquire()
    for expire in (0.5, -0.5):
        with pytest.raises(ValueError, match="expire"):
            lk.extend(expire)
        assert r.get(f"lock:{name}") == lk.id.encode()
    lk.extend()
    assert 1000 < r.pttl(f"lock:{name}") <= 2000
    lk.release()


def test_acquire_errors(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, expire=5)
    with pytest.raises(TimeoutNotUsable):
        lk.acquire(blocking=False, timeout=1)
    with pytest.raises(InvalidTimeout):
        lk.acquire(timeout=-1)
    with pytest.raises(TimeoutTooLarge):
        lk.acquire(timeout=6)
    assert lk.acquire()
    with pytest.raises(AlreadyAcquired):
        lk.acquire()
    lk.release()
    with pytest.raises(NotAcquired):
        lk.release()


def test_blocking_and_timeout(r: redis.Redis, name: str) -> None:
    holder = Lock(r, name, expire=10)
    assert holder.acquire()
    other = Lock(r, name, expire=10)
    assert not other.acquire(blocking=False)
    start = time.monotonic()
    assert not other.acquire(timeout=1)
    assert 0.9 < time.monotonic() - start < 3.0
    with pytest.raises(NotAcquired), Lock(r, name, expire=10, blocking=False):
        pass
    holder.release()


def test_sub_second_timeout_times_out(r: redis.Redis, name: str) -> None:
    # python-redis-lock's int(timeout) makes 0.5 a 0, "no timeout": it waited for ever.
    holder = Lock(r, name, expire=10)
    assert holder.acquire()
    other = Lock(r, name, expire=10)
    outcome: list[tuple[bool, float]] = []

    def wait() -> None:
        start = time.monotonic()
        outcome.append((other.acquire(timeout=0.5), time.monotonic() - start))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(5)
    holder.release()  # ends a wait that did not time out
    waiter.join(5)
    if outcome and outcome[0][0]:
        other.release()
    assert outcome and not outcome[0][0], outcome
    assert 0.4 < outcome[0][1] < 2.5, outcome
    # The original's checks stay, in its whole seconds; a negative fraction is negative too.
    with pytest.raises(InvalidTimeout):
        other.acquire(timeout=-0.5)
    short = Lock(r, name, expire=1)
    with pytest.raises(TimeoutTooLarge):
        short.acquire(timeout=2)
    assert short.acquire(timeout=1.5)  # int(1.5) is not above expire, as in the original
    short.release()
    with pytest.raises(TimeoutNotUsable):
        short.acquire(blocking=False, timeout=0.5)


def test_lease_expiry_is_noticed(r: redis.Redis, name: str) -> None:
    holder = Lock(r, name, expire=1)
    assert holder.acquire()
    start = time.monotonic()
    waiter = Lock(r, name, expire=5)
    assert waiter.acquire(timeout=5)
    assert time.monotonic() - start < 2.5
    with pytest.raises(NotAcquired):
        holder.release()
    waiter.release()


def test_extend(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, expire=2)
    with pytest.raises(NotAcquired):
        lk.extend()
    assert lk.acquire()
    lk.extend(30)
    assert 29000 < r.pttl(f"lock:{name}") <= 30000
    lk.extend()
    assert 1000 < r.pttl(f"lock:{name}") <= 2000
    with pytest.raises(ValueError, match="negative"):
        lk.extend(-3)
    lk.release()
    forever = Lock(r, name)
    with pytest.raises(TypeError, match="must be provided"):
        forever.extend()
    assert forever.acquire()
    with pytest.raises(NotExpirable):
        forever.extend(5)
    forever.release()


def test_no_expiry_is_a_renewed_lease(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name)
    assert lk.acquire()
    assert 0 < r.pttl(f"lock:{name}") <= 10_000
    lk.release()


@pytest.mark.timeout(30)
def test_an_id_released_elsewhere_and_taken_again_with_expiry_expires(
    r: redis.Redis, r2: redis.StrictRedis, name: str
) -> None:
    """A no-expiry hold of id w1 is released by another process (the original library, by id);
    this process takes w1 again with expire=1 just before the old hold's renewal is due (a
    third of the 10 s lease): the old renewal must not keep the new hold alive past its second.
    (Before, it renewed it to 10 s, and on for as long as the process lived.)"""
    first = Lock(r, name, id="w1")
    started = time.monotonic()
    assert first.acquire()
    time.sleep(max(0.0, started + 2.8 - time.monotonic()))
    original_redis_lock.Lock(r2, name, id="w1").release()
    again = Lock(r, name, id="w1", expire=1)
    assert again.acquire(blocking=False)
    time.sleep(max(0.0, started + 5.0 - time.monotonic()))  # past the tick and the expiry
    assert r.exists(f"lock:{name}") == 0


def test_auto_renewal_keeps_the_lease_and_a_loss_is_seen(
    r: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    lk = Lock(r, name, expire=1, auto_renewal=True)
    assert lk.acquire()
    time.sleep(1.6)
    assert lk.locked() and lk.get_owner_id() == lk.id  # renewed past its expire
    # Another party takes the key over: renewal finds it lost, says so, and the flag shows it
    # (python-redis-lock's renewal thread would die with an exception nobody sees).
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        r.set(f"lock:{name}", b"intruder", px=5000)
        deadline = time.monotonic() + 3
        while not lk.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lk.lost
        deadline = time.monotonic() + 2
        while "was lost" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "was lost" in caplog.text
    with pytest.raises(NotAcquired):
        lk.release()
    r.delete(f"lock:{name}")


def test_already_started(r: redis.Redis, name: str) -> None:
    lk = Lock(r, name, expire=5, auto_renewal=True)
    assert lk.acquire()
    r.delete(f"lock:{name}")  # lost without a release: the renewal is still on
    with pytest.raises(AlreadyStarted):
        lk.acquire()
    r.delete(f"lock:{name}")


def test_already_started_leaves_nothing_held(r: redis.Redis, name: str) -> None:
    # The acquire raising AlreadyStarted took the key first (as the original does); the caller is
    # told it failed, so the key is given back, not renewed (the original's stayed until expire).
    lk = Lock(r, name, expire=1, auto_renewal=True)
    assert lk.acquire()
    r.delete(f"lock:{name}")  # the lease is lost (an operator, a failover)
    deadline = time.monotonic() + 5
    while not lk.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lk.lost
    with pytest.raises(AlreadyStarted):
        lk.acquire()
    assert r.exists(f"lock:{name}") == 0
    time.sleep(2.0)  # past its expire and several renewal turns (every 2/3 s)
    assert r.exists(f"lock:{name}") == 0
    other = Lock(r, name, expire=1)
    assert other.acquire(blocking=False)
    other.release()
    # The object holds nothing now: it may acquire afresh, and has nothing to release.
    with pytest.raises(NotAcquired):
        lk.release()
    assert lk.acquire(blocking=False) and not lk.lost
    lk.release()


def test_waiter_is_woken_by_a_release(
    r: redis.Redis, r2: redis.StrictRedis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A waiter also looks again every _LONGEST_NAP (1 s) without a signal; made long here, so
    # that only the release's signal gets it in within the (noisy-machine) bound.
    monkeypatch.setattr(redis_lock, "_LONGEST_NAP", 30.0)
    holder = Lock(r, name)  # no expiry: nothing but the release frees it
    assert holder.acquire()
    lk = Lock(r2, name)
    delay = wake_delay(
        holder.release, lambda: lk.acquire(timeout=20), lk.release, settle=0.5, timeout=10
    )
    assert delay < 2.5


def test_reset_and_reset_all(r: redis.Redis, name: str) -> None:
    a = Lock(r, name + "a", expire=10)
    b = Lock(r, name + "b", expire=10)
    assert a.acquire() and b.acquire()
    a.reset()
    assert not a.locked() and b.locked()
    assert r.lrange(f"lock-signal:{name}a", 0, -1) == [b"1"]
    reset_all(r)
    assert not b.locked()
    assert r.keys("lock:*") == []


def test_module_mirrors_the_originals_names() -> None:
    for attr in (
        "Lock",
        "reset_all",
        "NotAcquired",
        "AlreadyAcquired",
        "AlreadyStarted",
        "TimeoutNotUsable",
        "InvalidTimeout",
        "TimeoutTooLarge",
        "NotExpirable",
    ):
        assert hasattr(original_redis_lock, attr)
        assert hasattr(redis_lock, attr)
    assert issubclass(redis_lock.NotAcquired, RuntimeError)


# -- mixed fleet: python-redis-lock and the shim on one lock ----------------------------------


def test_mixed_mutual_exclusion_both_directions(
    r: redis.Redis, r2: redis.StrictRedis, name: str
) -> None:
    original = original_redis_lock.Lock(r2, name, expire=10)
    shim = Lock(r, name, expire=10)
    assert original.acquire(blocking=False)
    assert not shim.acquire(blocking=False)
    assert shim.locked() and shim.get_owner_id() == original.id
    original.release()
    assert shim.acquire(blocking=False)
    assert not original.acquire(blocking=False)
    assert original.get_owner_id() == shim.id
    shim.release()


def test_original_waiter_is_woken_by_a_shim_release(
    r: redis.Redis, r2: redis.StrictRedis, name: str
) -> None:
    shim = Lock(r, name)
    assert shim.acquire()
    lk = original_redis_lock.Lock(r2, name)  # no expire: BLPOP without timeout
    delay = wake_delay(shim.release, lk.acquire, lk.release, settle=0.5, timeout=10)
    assert delay < 2.5, "python-redis-lock's waiter was not woken by the shim's release"


def test_shim_waiter_is_woken_by_an_original_release(
    r: redis.Redis, r2: redis.StrictRedis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in test_waiter_is_woken_by_a_release: no 1 s look without a signal to get it in.
    monkeypatch.setattr(redis_lock, "_LONGEST_NAP", 30.0)
    original = original_redis_lock.Lock(r2, name)  # no expiry
    assert original.acquire()
    lk = Lock(r, name)
    delay = wake_delay(
        original.release, lambda: lk.acquire(timeout=20), lk.release, settle=0.5, timeout=10
    )
    assert delay < 2.5


@pytest.mark.parametrize("module", [redis_lock, original_redis_lock], ids=["shim", "original"])
def test_the_acquire_warning_is_on_the_originals_logger(
    r: redis.Redis, name: str, module: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A program that quietened python-redis-lock's ``redis_lock.acquire`` logger (its warning on
    every failed non-blocking acquire) keeps it quiet: the shim logged on
    ``redmutex.compat.redis_lock`` instead."""
    holder = module.Lock(r, name, expire=5)
    assert holder.acquire()
    with caplog.at_level(logging.WARNING, logger="redis_lock.acquire"):
        assert not module.Lock(r, name, expire=5).acquire(blocking=False)
    assert [(rec.name, rec.getMessage()) for rec in caplog.records] == [
        ("redis_lock.acquire", f"Failed to acquire Lock('lock:{name}').")
    ]
    holder.release()
