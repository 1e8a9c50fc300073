"""What a holder believes about its lease when extends' answers come late, out of order, or not
at all: `remaining()` never promises more than Redis still has (API.md: `extend(ttl)` makes the
lease end `ttl` from now; `remaining()` is what is left of this object's lease).

The replies are slowed and dropped by the loopback FaultProxy (`_proxy.py`) in front of the
session's server; everything started here is stopped here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import wait_until as _wait_until
from _proxy import FaultProxy
from redmutex._server import RedisServer

# Our clock against Redis's millisecond expiry, on a loaded machine.
SLACK = 0.05


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def _pttl(r: redis.Redis, prefix: str, name: str) -> float:
    """Seconds left on the lock's key in Redis (0 when it is gone)."""
    ms = r.pttl(f"{prefix}{{{name}}}:lock")
    return max(ms, 0) / 1000


@pytest.mark.timeout(60)
def test_an_earlier_extend_answered_last_does_not_undo_a_later_shortening(
    proxy: FaultProxy, r: redis.Redis, prefix: str
) -> None:
    """extend(10) reaches Redis, its answer is held back; meanwhile another thread's extend(0.5)
    runs and is answered: Redis's lease ends 0.5 s later. When the first answer finally comes,
    the holder must not believe in its 10 s (before: remaining() about 9 s with the key gone)."""
    with redmutex.Client(proxy.url, prefix=prefix) as client:
        lock = redmutex.Lock(client, "late-answer", ttl=10)
        assert lock.acquire(timeout=5)
        time.sleep(0.3)  # the lease has run down a little: the first extend shows in the PTTL
        proxy.set_latency(1.0, "s2c")
        first = _Thread(lambda: lock.extend(10))
        first.start()
        _wait_until(lambda: _pttl(r, prefix, "late-answer") > 9.8, 10, "the first extend in Redis")
        proxy.set_latency(0.0, "s2c")
        lock.extend(0.5)  # on another connection: the first one waits for its answer
        assert first.outcome(20) is None
        left, in_redis = lock.remaining(), _pttl(r, prefix, "late-answer")
        assert left is not None
        assert left <= in_redis + SLACK, (left, in_redis)
        time.sleep(0.6)
        assert lock.remaining() == 0.0
        with pytest.raises(redmutex.LockLostError):
            lock.release()


def _acquire_then_extend_unanswered(lock: redmutex.Lock, proxy: FaultProxy, ttl: float) -> float:
    """Takes `lock`, then extends it to `ttl`: Redis runs the extend, its answer is dropped and
    the connection goes dark, so the call fails. Returns when the extend was sent (at the
    latest)."""
    assert lock.acquire(timeout=5)
    assert lock.token is not None
    proxy.drop_reply_to(lock.token.encode(), then_blackhole=True)
    sent = time.monotonic()
    with pytest.raises(redmutex.ConnectionError):
        lock.extend(ttl)
    return sent


@pytest.mark.timeout(60)
def test_a_shortening_extend_without_an_answer_shortens_what_the_holder_counts_on(
    proxy: FaultProxy, r: redis.Redis, prefix: str
) -> None:
    """extend(0.5) runs in Redis but its answer is lost and the connection stays dark, so the
    call fails: the lease may well end in 0.5 s, and remaining() says no more than that (before:
    the old 10 s lease stayed in force)."""
    with redmutex.Client(proxy.url, prefix=prefix, connect_timeout=1, command_timeout=1) as client:
        lock = redmutex.Lock(client, "dark-extend", ttl=10)
        sent = _acquire_then_extend_unanswered(lock, proxy, 0.5)
        assert proxy.stats.dropped_replies == 1
        left = lock.remaining()
        assert left is not None
        assert left <= max(0.0, 0.5 - (time.monotonic() - sent)) + SLACK, left
        proxy.heal()
        time.sleep(0.6)
        assert _pttl(r, prefix, "dark-extend") == 0  # Redis did run it
        assert lock.remaining() == 0.0


@pytest.mark.timeout(60)
def test_with_auto_renew_a_shortening_extend_without_an_answer_is_reported_lost_in_time(
    proxy: FaultProxy, prefix: str
) -> None:
    """extend(2) on an auto-renewed hold gets no answer: its request may still run late, so the
    holder counts on no more than its 2 s (see the test above), whatever renewal does meanwhile.
    When those 2 s are over, on_lost must say so then, not when renewal's first turn planned for
    the 60 s ttl comes (20 s later; its task is spawned half way there, at 10 s)."""
    lost_at: list[float] = []
    with redmutex.Client(
        proxy.url, prefix=prefix, connect_timeout=1, command_timeout=0.5
    ) as client:
        lock = redmutex.Lock(
            client,
            "dark-renewed",
            ttl=60,
            auto_renew=True,
            on_lost=lambda _: lost_at.append(time.monotonic()),
        )
        sent = _acquire_then_extend_unanswered(lock, proxy, 2.0)
        proxy.heal()
        _wait_until(lambda: bool(lost_at), 6.0, "on_lost after the extend's 2 s")
        assert 2.0 - SLACK <= lost_at[0] - sent <= 6.0, lost_at[0] - sent
        assert lock.lost is True
        with pytest.raises(redmutex.LockLostError):
            lock.release()
