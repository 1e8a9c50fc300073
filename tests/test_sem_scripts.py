"""The semaphore's acquire and release scripts (src/protocol/lua/sem_acquire.lua, sem_release.lua),
run as the Rust core sends them. They skip what an uncontended pair does not need: the acquire
reads the queue once when nobody queues and sets the only lease's expiry without reading it back,
the release prunes its holders once and passes what it learnt to the wake-up and the limit's drop.
These tests pin what that must not change: lapsed places at the queue's head are dropped before
they decide who enters, the live limit lives as long as the holders and the places, a release
of an ended lease wakes nobody and drops a limit nobody uses, and a release with a queue wakes
its head by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redmutex._core import _script_source

# The scripts as the Rust core sends them (their preludes included).
ACQUIRE = _script_source("sem_acquire")
RELEASE = _script_source("sem_release")
LEASE_MS, PLACE_MS = 10_000, 30_000


def _now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Sem:
    """One semaphore's keys and its two scripts, with `limit` permits."""

    def __init__(self, r: redis.Redis, prefix: str, limit: int) -> None:
        self.r, self.limit = r, limit
        base = f"{prefix}{{sem}}"
        self.holders, self.queue = f"{base}:holders", f"{base}:queue"
        self.deadlines, self.live = f"{base}:deadlines", f"{base}:limit"
        self.channel = f"{base}:wake"
        self._acquire = r.register_script(ACQUIRE)
        self._release = r.register_script(RELEASE)

    def keys(self) -> list[str]:
        return [self.holders, self.queue, self.deadlines, self.live]

    def acquire(self, token: str, mode: str = "2", lease_ms: int = LEASE_MS) -> Any:
        args = [token, lease_ms, self.limit, mode, PLACE_MS]
        return self._acquire(keys=self.keys(), args=args)

    def release(self, token: str) -> Any:
        return self._release(keys=self.keys(), args=[token, self.limit, self.channel])

    def place(self, token: str, deadline_ms: int) -> None:
        """Queues `token` behind the places there are, its place ending at `deadline_ms`."""
        self.r.zadd(self.deadlines, {token: deadline_ms})
        self.r.rpush(self.queue, token)
        self.r.pexpire(self.queue, PLACE_MS)
        self.r.pexpire(self.deadlines, PLACE_MS)


def _subscribed(r: redis.Redis, channel: str) -> Any:
    """A pubsub connection subscribed to `channel` (the server confirmed it)."""
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    confirmed = pubsub.get_message(timeout=5)
    assert confirmed is not None and confirmed["type"] == "subscribe"
    return pubsub


@pytest.fixture
def make_sem(r: redis.Redis, prefix: str) -> Iterator[Callable[[int], Sem]]:
    made: list[Sem] = []

    def make(limit: int) -> Sem:
        sem = Sem(r, f"{prefix}{len(made)}", limit)
        made.append(sem)
        return sem

    yield make
    for sem in made:
        r.delete(*sem.keys())


def test_an_uncontended_acquire_keeps_keys_as_long_as_the_lease(
    make_sem: Callable[[int], Sem], r: redis.Redis
) -> None:
    sem = make_sem(2)
    assert sem.acquire("a") == 1
    assert LEASE_MS - 1_000 < r.pttl(sem.holders) <= LEASE_MS
    assert LEASE_MS - 1_000 < r.pttl(sem.live) <= LEASE_MS
    assert r.get(sem.live) == b"2"
    assert not r.exists(sem.queue, sem.deadlines)
    # A second holder with a longer lease: both keys follow the longest lease.
    assert sem.acquire("b", lease_ms=3 * LEASE_MS) == 2
    assert 3 * LEASE_MS - 1_000 < r.pttl(sem.holders) <= 3 * LEASE_MS
    assert 3 * LEASE_MS - 1_000 < r.pttl(sem.live) <= 3 * LEASE_MS
    # A retry of a holder is admitted again without a second permit.
    assert sem.acquire("a") == 2


def test_the_limit_outlives_a_short_lease_while_somebody_queues(
    make_sem: Callable[[int], Sem], r: redis.Redis
) -> None:
    sem = make_sem(1)
    assert sem.acquire("a", lease_ms=1_000) == 1
    granted, _ = sem.acquire("w")  # queues behind "a"
    assert granted == 0 and r.lrange(sem.queue, 0, -1) == [b"w"]
    assert PLACE_MS - 1_000 < r.pttl(sem.live) <= PLACE_MS
    # "a" gives back its permit: "w" is first, enters, and its place goes from both keys.
    assert sem.release("a") == 1
    assert sem.acquire("w", lease_ms=1_000) == 1
    assert not r.exists(sem.queue, sem.deadlines)
    assert 0 < r.pttl(sem.live) <= 1_000


@pytest.mark.parametrize("limit", [1, 2])
def test_lapsed_places_at_the_head_do_not_keep_a_newcomer_out(
    make_sem: Callable[[int], Sem], r: redis.Redis, limit: int
) -> None:
    sem = make_sem(limit)
    now = _now_ms(r)
    sem.place("dead", now - 1)  # its waiter stopped refreshing: the place lapsed
    if limit == 2:
        sem.place("alive", now + PLACE_MS)
    # One free permit per place: the newcomer is admitted once the lapsed place is dropped.
    assert sem.acquire("new", mode="1") == 1
    assert r.zscore(sem.deadlines, "dead") is None
    assert b"dead" not in r.lrange(sem.queue, 0, -1)
    assert r.lrange(sem.queue, 0, -1) == ([b"alive"] if limit == 2 else [])


def test_a_live_head_place_keeps_a_newcomer_out(
    make_sem: Callable[[int], Sem], r: redis.Redis
) -> None:
    sem = make_sem(1)
    sem.place("first", _now_ms(r) + PLACE_MS)
    granted, ms = sem.acquire("new", mode="1", lease_ms=2 * PLACE_MS)
    assert granted == 0 and PLACE_MS - 1_000 < ms <= PLACE_MS
    # The first may take the permit at once and let its lease run out: the newcomer looks again
    # when a lease like its own would end, if that comes before the place lapses.
    granted, ms = sem.acquire("new", mode="1", lease_ms=LEASE_MS)
    assert granted == 0 and ms == LEASE_MS
    assert not r.exists(sem.holders)


@pytest.mark.parametrize("other_holder", [False, True])
def test_the_release_of_an_ended_lease_wakes_nobody_and_drops_an_unused_limit(
    make_sem: Callable[[int], Sem], r: redis.Redis, other_holder: bool
) -> None:
    sem = make_sem(2)
    assert sem.acquire("a") == 1
    if other_holder:
        assert sem.acquire("b") == 2
    # "a"'s lease ends while its keys live on (as when its holder stalled past its ttl).
    r.zadd(sem.holders, {"a": _now_ms(r) - 1})
    assert r.pttl(sem.holders) > 1_000 and r.pttl(sem.live) > 1_000
    pubsub = _subscribed(r, sem.channel)
    try:
        assert sem.release("a") == 0
        assert sem.release("never-held") == 0
        assert pubsub.get_message(timeout=0.3) is None
    finally:
        pubsub.close()
    assert r.zscore(sem.holders, "a") is None
    if other_holder:
        # A live holder keeps the limit (and the holders' key).
        assert r.get(sem.live) == b"2" and r.zrange(sem.holders, 0, -1) == [b"b"]
    else:
        assert not r.exists(sem.holders, sem.live)


def test_an_entry_past_waiting_places_keeps_the_limit_for_them(
    make_sem: Callable[[int], Sem], r: redis.Redis
) -> None:
    sem = make_sem(3)
    sem.place("w", _now_ms(r) + PLACE_MS)
    # Three free permits and one place: a newcomer enters past it, with a short lease; the
    # limit must outlive that lease as long as the place does.
    assert sem.acquire("x", mode="1", lease_ms=1_000) == 1
    assert r.lrange(sem.queue, 0, -1) == [b"w"]
    assert PLACE_MS - 1_000 < r.pttl(sem.live) <= PLACE_MS


def test_a_release_wakes_the_queue_head_by_name_and_keeps_the_limit_for_it(
    make_sem: Callable[[int], Sem], r: redis.Redis
) -> None:
    sem = make_sem(1)
    assert sem.acquire("a") == 1
    assert sem.acquire("w")[0] == 0
    pubsub = _subscribed(r, sem.channel)
    try:
        assert sem.release("a") == 1
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == b"w"
    finally:
        pubsub.close()
    assert r.get(sem.live) == b"1"  # "w" still queues: the limit stays
    # Nobody queues or holds any more: the last release drops the limit, and wakes all ('').
    r.delete(sem.queue, sem.deadlines)
    assert sem.acquire("b") == 1
    assert sem.release("b") == 1
    assert not r.exists(sem.holders, sem.live)
