"""The fair lock's scripts on the hand-off path, run as the Rust core sends them: a join
(src/protocol/lua/lock_acquire_fair.lua) and a grant on release (lock_grant.lua, the rest of
lock_release.lua once the name has a queue). Issue 18 item 3 cut what Redis does per hand-off:
one TIME per script, no pruning while the head's place is live, the queue empty or the lock held
by another, the queue keys' expiry set only when it falls short of a place, and a queue of two
keys (the waitlist and its places' records, waitlist.lua) instead of three. These tests pin that
work away and, first, that the queue stays right without it: lapsed places never granted, FIFO
order, fences increasing, the keys outliving every live place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redmutex._server import RedisServer

LUA = Path(__file__).resolve().parents[1] / "src" / "protocol" / "lua"

PLACE_MS = 6000  # how long a silent waiter keeps its place (engine::waiting::QUEUE_PLACE)
KEEP_MS = PLACE_MS + PLACE_MS // 2  # how long a join makes the queue keys last
SLACK_MS = 3000  # scripts::GRANT_SLACK_MS
FENCE_TTL_MS = 5000
CHANNEL = "t{n}:wake"


def _source(*files: str) -> str:
    return "".join((LUA / f).read_text() for f in files)


JOIN = _source("queue_prune.lua", "fence_next.lua", "waitlist.lua", "lock_acquire_fair.lua")
# The release as scripts.rs builds it: lock_release.lua's compare, and once it found a queue, the
# grant after the preludes.
RELEASE = _source(
    "lock_release.lua",
    "queue_prune.lua",
    "fence_next.lua",
    "waitlist.lua",
    "lock_grant.lua",
    "lock_release_grant.lua",
)
# A MultiLock's release: the same grant prelude, for each of its names.
MULTI_RELEASE = _source(
    "queue_prune.lua", "fence_next.lua", "waitlist.lua", "lock_grant.lua", "multi_release.lua"
)
KEYS = ["t{n}:lock", "t{n}:fence", "t{n}:waitlist", "t{n}:waitlist:places"]
LOCK, FENCE, QUEUE, PLACES = KEYS


class Fair:
    """The join and the grant of one name, on a redis-server of the test's own (commandstats)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._join = r.register_script(JOIN)
        self._release = r.register_script(RELEASE)
        r.script_load(JOIN)
        r.script_load(RELEASE)

    def join(
        self, token: str, lease_ms: int = 10_000, inbox: str = "ab12", mode: str = "1"
    ) -> list[int]:
        """`mode` "1": a fair waiter's join; "b": an unfair waiter's (takes a free lock)."""
        args: list[str | int] = [token, lease_ms, PLACE_MS, mode, inbox, FENCE_TTL_MS]
        return self._join(keys=KEYS, args=args)  # type: ignore[no-any-return]

    def release(self, holder: str | bytes | None = None) -> None:
        """`holder`'s release (by default whoever holds the lock now), granting it to the
        queue's head."""
        holder = holder or self.r.get(LOCK)  # type: ignore[assignment]
        assert holder is not None
        assert self._release(keys=KEYS, args=[holder, CHANNEL, SLACK_MS, FENCE_TTL_MS]) == 1

    def calls(self) -> dict[str, int]:
        stats = self.r.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def ran(self, step: Callable[[], object]) -> dict[str, int]:
        """The commands `step` made the server run (a script call and each command in it)."""
        before = self.calls()
        step()
        after = self.calls()
        ran = {name: after[name] - before.get(name, 0) for name in after}
        return {name: n for name, n in ran.items() if n and name != "info"}

    def queue(self) -> list[bytes]:
        return self.r.lrange(QUEUE, 0, -1)  # type: ignore[return-value]

    def deadline(self, token: str) -> int | None:
        """The deadline of `token`'s place: its record's second field (None: no record)."""
        record: bytes | None = self.r.hget(PLACES, token)  # type: ignore[assignment]
        return int(record.split(b" ")[1]) if record else None

    def lapse(self, *tokens: str) -> None:
        """As if `tokens` had stopped refreshing their places long ago: the deadlines passed."""
        for token in tokens:
            record: bytes = self.r.hget(PLACES, token)  # type: ignore[assignment]
            lease, _, inbox = record.split(b" ")
            self.r.hset(PLACES, token, b" ".join([lease, b"1", inbox]))

    def server_ms(self) -> int:
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def fair(make_server: Callable[..., RedisServer]) -> Iterator[Fair]:
    server = make_server()
    r = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        yield Fair(r)
    finally:
        r.close()


def test_a_join_records_the_lease_the_place_and_the_inbox(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    before = fair.server_ms()
    assert fair.join("a", lease_ms=7000, inbox="ab12")[0] == 0
    assert fair.join("b", inbox="")[0] == 0
    lease, deadline, inbox = fair.r.hget(PLACES, "a").split(b" ")  # type: ignore[union-attr]
    assert (lease, inbox) == (b"7000", b"ab12")
    assert before + PLACE_MS <= int(deadline) <= fair.server_ms() + PLACE_MS
    assert fair.r.hget(PLACES, "b").split(b" ")[2] == b""  # type: ignore[union-attr]
    assert fair.queue() == [b"a", b"b"]


def test_a_grant_drops_a_lapsed_head_and_grants_the_next_live_place(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b", "c"):
        assert fair.join(token)[0] == 0
    fair.lapse("a")  # a stopped refreshing its place
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"c"]
    assert fair.deadline("a") is None and fair.r.hkeys(PLACES) == [b"c"]
    # b's grant lasts at most its place left plus the slack.
    assert 0 < fair.r.pttl(LOCK) <= 10_000


def test_a_live_head_is_granted_as_read_and_a_lapsed_place_behind_it_never_comes_first(
    fair: Fair,
) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b", "c"):
        assert fair.join(token)[0] == 0
    fair.lapse("b")  # b's place lapsed, behind a live head
    ran = fair.ran(fair.release)
    assert fair.r.get(LOCK) == b"a"
    # The head's record is the only one read; nothing behind it is looked at.
    assert ran.get("hget") == 1 and "lindex" not in ran and ran.get("lpop") == 1, ran
    assert fair.queue() == [b"b", b"c"]
    # b comes first now, but lapsed: it is dropped, and c, the only one left, is granted.
    fair.release()
    assert fair.r.get(LOCK) == b"c"
    assert fair.r.exists(QUEUE, PLACES) == 0


def test_a_head_without_a_record_counts_as_lapsed(fair: Fair) -> None:
    """A token in the waitlist without a place's record (not a state the scripts make) is
    never granted: it is dropped as a lapsed place is."""
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b"):
        assert fair.join(token)[0] == 0
    fair.r.hdel(PLACES, "a")
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.r.exists(QUEUE, PLACES) == 0


def test_grants_read_the_clock_once_and_give_increasing_fences(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    tokens = [f"w{i}" for i in range(5)]
    for token in tokens:
        assert fair.join(token)[0] == 0
    last = 0
    for token in tokens:
        before_us = fair.server_ms() * 1000
        ran = fair.ran(fair.release)
        assert ran.get("time") == 1, ran  # the place's clock and the fence's: one reading
        assert fair.r.get(LOCK) == token.encode()
        fence = int(fair.r.get(FENCE) or 0)
        assert fence > last and fence >= before_us
        last = fence
    # The counter ahead of the clock (e.g. set back by a failover the other way): counter + 1.
    fair.r.set(FENCE, last + 10**12, px=FENCE_TTL_MS)
    fair.r.set(LOCK, "x", px=10_000)
    assert fair.join("late")[0] == 0
    fair.release()
    assert int(fair.r.get(FENCE) or 0) == last + 10**12 + 1


def test_joining_an_empty_queue_starts_it_even_over_stale_records(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    # Records left without a waitlist (not a state the scripts make), lapsed or not.
    live = fair.server_ms() + 60_000
    fair.r.hset(PLACES, mapping={"a": "10000 1 ab12", "gone": "10000 1 ", "odd": f"1 {live} "})
    ran = fair.ran(lambda: fair.join("a"))
    assert "lpop" not in ran and ran.get("time") == 1, ran
    assert fair.queue() == [b"a"]
    assert (fair.deadline("a") or 0) > fair.server_ms()
    # Behind a, b is queued; the records without a place in the waitlist are never granted.
    assert fair.join("b")[0] == 0
    assert fair.queue() == [b"a", b"b"]
    fair.release()
    assert fair.r.get(LOCK) == b"a"
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.r.exists(QUEUE, PLACES) == 0


def test_a_join_behind_a_held_lock_drops_nothing_and_a_lapsed_place_goes_when_it_would_count(
    fair: Fair,
) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b", "c"):
        assert fair.join(token)[0] == 0
    fair.lapse("a", "b")  # both stopped refreshing
    ran = fair.ran(lambda: fair.join("d"))
    assert not {"lpop", "hdel", "hget"} & set(ran) and ran.get("time") == 1, ran
    assert fair.queue() == [b"a", b"b", b"c", b"d"]
    # b comes back before anybody was served past it: it keeps its place.
    assert fair.join("b")[0] == 0
    assert fair.queue() == [b"a", b"b", b"c", b"d"]
    # The lock free, a newcomer finds a lapsed head: dropped, and b (live, first) is not jumped;
    # the newcomer looks again when b's place would lapse.
    fair.r.delete(LOCK)
    busy, ms, _ = fair.join("e", inbox="")
    assert busy == 0 and 0 < ms <= PLACE_MS
    assert fair.r.exists(LOCK) == 0  # the take was given back: the lock is left to b
    assert fair.queue() == [b"b", b"c", b"d", b"e"]
    assert fair.deadline("a") is None
    fair.r.set(LOCK, "x", px=10_000)
    fair.release()
    assert fair.r.get(LOCK) == b"b"


def test_the_queue_keys_outlive_every_place_and_get_their_expiry_only_when_short(
    fair: Fair,
) -> None:
    fair.r.set(LOCK, "x", px=10_000)

    def expiries() -> list[int]:
        return [int(fair.r.pttl(key)) for key in (QUEUE, PLACES)]

    ran = fair.ran(lambda: fair.join("a"))
    assert ran.get("pexpire") == 2, ran  # a new queue: its keys get their expiry
    assert all(PLACE_MS < ms <= KEEP_MS for ms in expiries()), expiries()
    # The next joins find the keys lasting longer than a place: one PTTL, no PEXPIRE.
    for token in ("b", "c"):
        ran = fair.ran(lambda token=token: fair.join(token))  # type: ignore[misc]
        assert "pexpire" not in ran and ran.get("pttl") == 2, ran  # (+1: the holder's lease)
    # Every key outlives every live place.
    last_place = max(fair.deadline(t) or 0 for t in ("a", "b", "c"))
    now = fair.server_ms()
    assert all(now + ms >= last_place for ms in expiries()), (expiries(), last_place - now)
    # Short of a place (time went by): the join sets both again.
    fair.r.pexpire(PLACES, PLACE_MS - 100)
    ran = fair.ran(lambda: fair.join("d"))
    assert ran.get("pexpire") == 2, ran
    assert all(PLACE_MS < ms <= KEEP_MS for ms in expiries()), expiries()
    # The places' hash gone under a waitlist (not a state the scripts make): created anew, and
    # both keys expire.
    fair.r.delete(PLACES)
    ran = fair.ran(lambda: fair.join("e"))
    assert ran.get("pexpire") == 2, ran
    assert all(PLACE_MS < ms <= KEEP_MS for ms in expiries()), expiries()


@pytest.mark.parametrize("mode", ["1", "b"])
def test_a_hand_off_costs_redis_fewer_commands(fair: Fair, mode: str) -> None:
    """The hand-off of `make bench` (hold, release to a queued waiter, ask again), fair ("1")
    and unfair ("b"): the release's grant and the former holder's join. Before issue 18 item 3
    it took 29 commands (two script calls and 27 commands in them) whether others queued or not.
    Since then: the grant writes over the released lock key instead of deleting it first; a
    grant that empties the queue deletes its keys in one command; an unfair waiter's join reads
    the queue only when it keeps a place it had (2 processes: 24 before these two); the place's
    deadline rides in its record, so the hand-off writes and reads no deadlines zset; and a
    fair waiter's join starts with the take, which finds the lock held, and reads the queue
    only to refresh a place (22 fair, 21 unfair before these two: 18 now, with one waiter or
    several). An unfair waiter's join reads the lock with a GET instead (it comes after a first
    attempt found the lock held: a SET that does not take costs Redis more than a read)."""

    def hand_off(holder: str, waiting: str) -> int:
        ran = fair.ran(lambda: fair.release(holder))
        assert fair.r.get(LOCK) == waiting.encode()
        alone = not fair.queue()
        if alone:  # the queue's keys went in one DEL; the lock key was written over
            assert fair.r.exists(QUEUE, PLACES) == 0
            assert ran.get("del") == 1 and not {"lpop", "hdel"} & set(ran), ran
        else:
            assert "del" not in ran, ran
        ran_join = fair.ran(lambda: fair.join(holder, mode=mode))
        assert ran_join["evalsha"] == 1 and ran["evalsha"] == 1, (ran, ran_join)
        assert "lindex" not in ran_join, ran_join
        # The lock found held: the fair join's take did not take; the unfair one only read it.
        assert ("set" in ran_join) == (mode == "1"), ran_join
        assert not {"zadd", "zscore", "zrem"} & (set(ran) | set(ran_join)), (ran, ran_join)
        return sum(ran.values()) + sum(ran_join.values())

    fair.r.set(LOCK, "a", px=10_000)
    assert fair.join("b", mode=mode)[0] == 0
    # Two processes: the queue is empty when the former holder joins again.
    holder, waiting = "a", "b"
    for _ in range(3):
        assert hand_off(holder, waiting) == 18
        holder, waiting = waiting, holder
    # Four processes: two others queued when the former holder joins again.
    for token in ("c", "d"):
        assert fair.join(token, mode=mode)[0] == 0
    order = [holder, waiting, "c", "d"]
    for _ in range(4):
        assert hand_off(order[0], order[1]) == 18
        order = order[1:] + order[:1]


def test_a_grant_that_empties_the_queue_leaves_no_place_behind(fair: Fair) -> None:
    """The grant to the only queued waiter deletes the queue's keys: a record left without a
    place in the waitlist goes with them; with another behind the head, only the head's place
    goes."""
    fair.r.set(LOCK, "x", px=10_000)
    assert fair.join("a")[0] == 0
    fair.r.hset(PLACES, "stray", f"10000 {fair.server_ms() + 60_000} ab12")
    fair.release()
    assert fair.r.get(LOCK) == b"a"
    assert fair.r.exists(QUEUE, PLACES) == 0
    for token in ("b", "c"):
        assert fair.join(token)[0] == 0
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"c"] and fair.r.hkeys(PLACES) == [b"c"]


def test_an_unfair_join_reads_the_queue_only_to_keep_a_place(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    # New places: no LINDEX; the first starts the queue (its keys get their expiry).
    ran = fair.ran(lambda: fair.join("a", mode="b"))
    assert "lindex" not in ran and ran.get("pexpire") == 2, ran
    ran = fair.ran(lambda: fair.join("b", mode="b"))
    assert "lindex" not in ran and "pexpire" not in ran, ran
    assert fair.queue() == [b"a", b"b"]
    # A refresh keeps its place (the queue is read: no second entry).
    ran = fair.ran(lambda: fair.join("a", mode="b"))
    assert ran.get("lindex") == 1 and "rpush" not in ran, ran
    assert fair.queue() == [b"a", b"b"]
    # A record left without a waitlist (the waitlist itself gone): the refresh starts it again.
    fair.r.delete(QUEUE)
    ran = fair.ran(lambda: fair.join("b", mode="b"))
    assert ran.get("rpush") == 1 and ran.get("pexpire") == 2, ran
    assert fair.queue() == [b"b"]
    # The lock free: taken past the queue; a taker that had a place (a resend whose first send
    # joined) gives it up, and the others keep theirs.
    assert fair.join("c", mode="b")[0] == 0
    fair.r.delete(LOCK)
    assert fair.join("b", mode="b")[0] == 1
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"c"]
    assert fair.deadline("b") is None
    # Released: granted to c, the queue's only waiter.
    fair.release()
    assert fair.r.get(LOCK) == b"c"
    assert fair.r.exists(QUEUE, PLACES) == 0


def test_a_release_that_grants_nothing_frees_the_lock(fair: Fair) -> None:
    """The grant writes over the released lock key; when there is nobody to grant it to (every
    place lapsed, or left without a record), the release deletes the key and wakes all."""
    wake = fair.r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(CHANNEL)
    try:
        fair.r.set(LOCK, "x", px=10_000)
        for token in ("a", "b"):
            assert fair.join(token)[0] == 0
        fair.lapse("a", "b")
        fair.release()
        assert fair.r.exists(LOCK) == 0
        assert fair.r.exists(QUEUE, PLACES) == 0
        fair.r.set(LOCK, "x", px=10_000)
        assert fair.join("norecord")[0] == 0
        fair.r.hdel(PLACES, "norecord")
        fair.release()
        assert fair.r.exists(LOCK) == 0
        assert fair.queue() == []
        heard: list[bytes] = []
        for _ in range(10):  # (a None for the subscription's confirmation, ignored)
            message = wake.get_message(timeout=1.0)
            if message:
                heard.append(message["data"])
            if len(heard) == 2:
                break
        assert heard == [b"", b""]
    finally:
        wake.close()


def test_a_multilock_release_grants_as_the_lock_release_does(fair: Fair) -> None:
    """A MultiLock's release hands each name on as lock_release.lua does: to the only queued
    waiter with the queue's keys deleted in one command, else taking the head out."""
    release = fair.r.register_script(MULTI_RELEASE)
    other = ["t{n}:o", "t{n}:o:fence", "t{n}:o:waitlist", "t{n}:o:places"]
    args = ["m", SLACK_MS, FENCE_TTL_MS, CHANNEL, "t{n}:o:wake"]
    fair.r.set(LOCK, "m", px=10_000)
    fair.r.set(other[0], "m", px=10_000)
    assert fair.join("a")[0] == 0
    ran = fair.ran(lambda: release(keys=[*KEYS, *other], args=args))
    assert fair.r.get(LOCK) == b"a" and fair.r.get(other[0]) is None
    assert fair.r.exists(QUEUE, PLACES) == 0
    assert ran.get("del") == 2 and not {"lpop", "hdel"} & set(ran), ran  # (+1: other)
    # Two queued: the head is taken out, the other keeps its place.
    fair.r.set(LOCK, "m", px=10_000)
    for token in ("b", "c"):
        assert fair.join(token)[0] == 0
    assert release(keys=[*KEYS, *other], args=args) == 1
    assert fair.r.get(LOCK) == b"b" and fair.queue() == [b"c"]
    assert fair.r.hkeys(PLACES) == [b"c"]
