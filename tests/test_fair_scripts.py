"""The lock's queue scripts on the hand-off path, run as the Rust core sends them: a join
(src/protocol/lua/lock_acquire_fair.lua) and a grant on release (lock_grant.lua, the rest of
lock_release.lua once the name has a queue). Issue 18 item 3 cut what Redis does per hand-off:
one TIME per script, no pruning while the head's place is live, the queue empty or the lock held
by another, the queue's expiry set only when it is new or falls short of a place, and a queue of
one key: a hash of places whose records open with their turn (seq, the server's clock in µs when
the place was taken; waitlist.lua), instead of a list of tokens beside a hash of records. These
tests pin that work away and, first, that the queue stays right without it: lapsed places never
granted, FIFO order, a refresh keeping its turn, fences increasing, the key outliving every live
place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redmutex._core import _script_source
from redmutex._server import RedisServer

PLACE_MS = 6000  # how long a silent waiter keeps its place (engine::waiting::QUEUE_PLACE)
KEEP_MS = PLACE_MS + PLACE_MS // 2  # how long a join makes the queue last
SLACK_MS = 3000  # scripts::GRANT_SLACK_MS
FENCE_TTL_MS = 5000
CHANNEL = "t{n}:wake"


# The scripts as the Rust core sends them (their preludes included).
JOIN = _script_source("lock_acquire_fair")
# The release: lock_release.lua's compare, and once it found a queue, the grant after the preludes.
RELEASE = _script_source("lock_release")
# A MultiLock's release: the same grant prelude, for each of its names.
MULTI_RELEASE = _script_source("multi_release")
KEYS = ["t{n}:lock", "t{n}:fence", "t{n}:lock:queue"]
LOCK, FENCE, QUEUE = KEYS


class Fair:
    """The join and the grant of one name, on a redis-server of the test's own (commandstats)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._join = r.register_script(JOIN)
        self._release = r.register_script(RELEASE)
        r.script_load(JOIN)
        r.script_load(RELEASE)

    def join(self, token: str, lease_ms: int = 10_000, inbox: str = "ab12", mode: str = "1") -> Any:
        """`mode` "1": a fair waiter's join; "b": an unfair waiter's (takes a free lock). The
        reply: the fence (an int) when granted, else [0, ms, fence]."""
        args: list[str | int] = [token, lease_ms, PLACE_MS, mode, inbox, FENCE_TTL_MS, CHANNEL]
        return self._join(keys=KEYS, args=args)

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
        """The queued tokens in turn: by their records, which open with the place's seq."""
        places: dict[bytes, bytes] = self.r.hgetall(QUEUE)  # type: ignore[assignment]
        return [token for token, _ in sorted(places.items(), key=lambda item: item[1])]

    def record(self, token: str) -> list[bytes] | None:
        """`token`'s place: seq, deadline ms, lease ms, inbox (None: no place)."""
        record: bytes | None = self.r.hget(QUEUE, token)  # type: ignore[assignment]
        return record.split(b" ") if record else None

    def deadline(self, token: str) -> int | None:
        """The deadline of `token`'s place: its record's second field (None: no place)."""
        record = self.record(token)
        return int(record[1]) if record else None

    def lapse(self, *tokens: str) -> None:
        """As if `tokens` had stopped refreshing their places long ago: the deadlines passed."""
        for token in tokens:
            seq, _, lease, inbox = self.record(token) or []
            self.r.hset(QUEUE, token, b" ".join([seq, b"1", lease, inbox]))

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


def test_a_join_records_its_turn_the_place_the_lease_and_the_inbox(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    before = fair.server_ms()
    assert fair.join("a", lease_ms=7000, inbox="ab12")[0] == 0
    assert fair.join("b", inbox="")[0] == 0
    seq, deadline, lease, inbox = fair.record("a") or []
    assert (lease, inbox) == (b"7000", b"ab12")
    assert len(seq) == 16 and before * 1000 <= int(seq) <= fair.server_ms() * 1000 + 999
    assert before + PLACE_MS <= int(deadline) <= fair.server_ms() + PLACE_MS
    assert (fair.record("b") or [])[3] == b""
    assert fair.queue() == [b"a", b"b"]


def test_a_head_that_takes_a_lock_whose_lease_ran_out_tells_the_waiters_behind(
    fair: Fair,
) -> None:
    """b, told to wait for a's place, hears when a took the lock: a's lease may run out
    unreleased too, and b must look again then, not when a's place would have lapsed."""
    fair.r.set(LOCK, "x", px=10_000)
    assert fair.join("a")[0] == 0
    assert fair.join("b")[0] == 0
    fair.r.delete(LOCK)  # x's lease ran out: nobody released, nobody was granted
    told, ms, _ = fair.join("b")
    assert told == 0 and PLACE_MS - 1_000 < ms <= PLACE_MS  # a's place comes first
    ran = fair.ran(lambda: fair.join("a", lease_ms=3000))
    assert fair.r.get(LOCK) == b"a" and ran.get("publish") == 1
    told, ms, _ = fair.join("b")
    assert told == 0 and 0 < ms <= 3000  # now: a's lease
    # A take with nobody queued (the common fair acquire) publishes nothing.
    fair.r.delete(LOCK, QUEUE)
    ran = fair.ran(lambda: fair.join("c"))
    assert fair.r.get(LOCK) == b"c" and "publish" not in ran


def test_a_grant_drops_a_lapsed_head_and_grants_the_next_live_place(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b", "c"):
        assert fair.join(token)[0] == 0
    fair.lapse("a")  # a stopped refreshing its place
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"c"]
    assert fair.deadline("a") is None
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
    # The places are read once; only the head's goes.
    assert ran.get("hgetall") == 1 and ran.get("hdel") == 1 and "hget" not in ran, ran
    assert fair.queue() == [b"b", b"c"]
    # b comes first now, but lapsed: it is dropped, and c, the only one left, is granted.
    fair.release()
    assert fair.r.get(LOCK) == b"c"
    assert fair.r.exists(QUEUE) == 0


def test_a_place_of_another_format_counts_as_lapsed(fair: Fair) -> None:
    """A record the scripts did not write (an older client's '<lease> <deadline> <inbox>', or
    anything else) is never granted: it is dropped as a lapsed place is when it comes first."""
    fair.r.set(LOCK, "x", px=10_000)
    live = fair.server_ms() + 60_000
    fair.r.hset(QUEUE, mapping={"old": f"10000 {live} ab12", "odd": "0 x"})
    assert fair.join("a")[0] == 0
    fair.release()
    assert fair.r.get(LOCK) == b"a"
    assert fair.r.exists(QUEUE) == 0


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
    # The counter ahead of the clock (e.g. set back by a failover the other way): counter + 1,
    # published as such.
    wake = fair.r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(CHANNEL + ":ab12")
    try:
        fair.r.set(FENCE, last + 10**12, px=FENCE_TTL_MS)
        fair.r.set(LOCK, "x", px=10_000)
        assert fair.join("late")[0] == 0
        fair.release()
        assert int(fair.r.get(FENCE) or 0) == last + 10**12 + 1
        message = None
        for _ in range(10):
            message = wake.get_message(timeout=1.0)
            if message:
                break
        assert message is not None
        token, fence_text, px = message["data"].split(b" ")
        assert (token, int(fence_text)) == (b"late", last + 10**12 + 1) and 0 < int(px) <= 10_000
    finally:
        wake.close()


def test_a_refresh_keeps_its_turn_and_a_new_place_goes_last(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    for token in ("a", "b", "c"):
        assert fair.join(token)[0] == 0
    seq_b = (fair.record("b") or [])[0]
    fair.lapse("a", "b")  # both stopped refreshing
    # A join behind a held lock drops nothing and reads no other place.
    ran = fair.ran(lambda: fair.join("d"))
    assert not {"hdel", "hget", "hgetall"} & set(ran) and ran.get("time") == 1, ran
    assert fair.queue() == [b"a", b"b", b"c", b"d"]
    # b comes back before anybody was served past it: it keeps its turn, with a new deadline.
    ran = fair.ran(lambda: fair.join("b"))
    assert ran.get("hget") == 1 and ran.get("hset") == 1, ran
    assert (fair.record("b") or [])[0] == seq_b and (fair.deadline("b") or 0) > fair.server_ms()
    assert fair.queue() == [b"a", b"b", b"c", b"d"]
    # The lock free, a newcomer finds a lapsed head: dropped, and b (live, first) is not jumped;
    # the newcomer looks again when b's place would lapse, from the last place.
    fair.r.delete(LOCK)
    busy, ms, _ = fair.join("e", inbox="")
    assert busy == 0 and 0 < ms <= PLACE_MS
    assert fair.r.exists(LOCK) == 0  # the take was given back: the lock is left to b
    assert fair.queue() == [b"b", b"c", b"d", b"e"]
    assert fair.deadline("a") is None
    # a, whose lapsed place went, comes back at the end of the line.
    fair.r.set(LOCK, "x", px=10_000)
    assert fair.join("a")[0] == 0
    assert fair.queue() == [b"b", b"c", b"d", b"e", b"a"]
    fair.release()
    assert fair.r.get(LOCK) == b"b"


def test_the_queue_outlives_every_place_and_gets_its_expiry_only_when_new_or_short(
    fair: Fair,
) -> None:
    fair.r.set(LOCK, "x", px=10_000)

    def expiry() -> int:
        return int(fair.r.pttl(QUEUE))

    ran = fair.ran(lambda: fair.join("a"))
    # A new queue: its expiry set with the key just made (NX), without reading it first.
    assert ran.get("pexpire") == 1 and ran.get("pttl") == 1, ran  # (the pttl: the holder's)
    assert PLACE_MS < expiry() <= KEEP_MS, expiry()
    # The next joins find the key lasting longer than a place: no expiry set.
    for token in ("b", "c"):
        fair.r.pexpire(QUEUE, KEEP_MS)
        ran = fair.ran(lambda token=token: fair.join(token))  # type: ignore[misc]
        assert ran.get("pttl") == 2, ran  # (+1: the holder's lease)
        assert PLACE_MS < expiry() <= KEEP_MS, expiry()
    # A refresh that finds it lasting long enough: one PTTL, no PEXPIRE.
    ran = fair.ran(lambda: fair.join("b"))
    assert "pexpire" not in ran and ran.get("pttl") == 2, ran
    # The key outlives every live place.
    last_place = max(fair.deadline(t) or 0 for t in ("a", "b", "c"))
    assert fair.server_ms() + expiry() >= last_place, (expiry(), last_place)
    # Short of a place (time went by): a join sets it again, and never shortens it.
    fair.r.pexpire(QUEUE, PLACE_MS - 100)
    fair.join("d")
    assert PLACE_MS < expiry() <= KEEP_MS, expiry()
    fair.r.pexpire(QUEUE, 60_000)
    fair.join("e")
    fair.join("a")
    assert expiry() > KEEP_MS


@pytest.mark.parametrize("mode", ["1", "b"])
def test_a_hand_off_costs_redis_fewer_commands(fair: Fair, mode: str) -> None:
    """The hand-off of `make bench` (hold, release to a queued waiter, ask again), fair ("1")
    and unfair ("b"): the release's grant and the former holder's join. Before issue 18 item 3
    it took 29 commands (two script calls and 27 commands in them) whether others queued or not;
    18 in the last round (the grant writing over the released lock key, a grant that empties the
    queue deleting it in one command, the deadline riding in the place's record, a fair join
    starting with the take, an unfair one reading the lock with a GET). With the queue in one
    hash, 15 with one waiter (two processes) and 16 with several: the grant reads the places
    (HGETALL), writes the lock and removes one field (the hash goes with its last one); the
    join writes its place (HSETNX) and sets the expiry of a queue it started (PEXPIRE NX), or,
    with others queued, reads it (PTTL) instead. Since the grant publishes before it writes (a
    user whom the ACL refuses the channel must find nothing changed), it reads the fence counter
    (GET) and writes it (SET) rather than one SET ... GET: 16 and 17."""

    def hand_off(holder: str, waiting: str) -> int:
        ran = fair.ran(lambda: fair.release(holder))
        assert fair.r.get(LOCK) == waiting.encode()
        assert ran.get("hgetall") == 1 and ran.get("hdel") == 1 and "del" not in ran, ran
        assert ran.get("get") == 2 and ran.get("set") == 2, ran  # (the holder's, the fence's)
        if not fair.queue():  # the hash went with its last field
            assert fair.r.exists(QUEUE) == 0
        ran_join = fair.ran(lambda: fair.join(holder, mode=mode))
        assert ran_join["evalsha"] == 1 and ran["evalsha"] == 1, (ran, ran_join)
        assert not {"hget", "hgetall", "hdel"} & set(ran_join), ran_join
        # The lock found held: the fair join's take did not take; the unfair one only read it.
        assert ("set" in ran_join) == (mode == "1"), ran_join
        return sum(ran.values()) + sum(ran_join.values())

    fair.r.set(LOCK, "a", px=10_000)
    assert fair.join("b", mode=mode)[0] == 0
    # Two processes: the queue is empty when the former holder joins again.
    holder, waiting = "a", "b"
    for _ in range(3):
        assert hand_off(holder, waiting) == 16
        holder, waiting = waiting, holder
    # Four processes: two others queued when the former holder joins again.
    for token in ("c", "d"):
        assert fair.join(token, mode=mode)[0] == 0
    order = [holder, waiting, "c", "d"]
    for _ in range(4):
        assert hand_off(order[0], order[1]) == 17
        order = order[1:] + order[:1]


def test_a_grant_to_the_last_place_leaves_no_queue_behind(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    assert fair.join("a")[0] == 0
    fair.release()
    assert fair.r.get(LOCK) == b"a"
    assert fair.r.exists(QUEUE) == 0
    for token in ("b", "c"):
        assert fair.join(token)[0] == 0
    fair.release()
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"c"]


def test_an_unfair_join_reads_the_queue_only_to_keep_a_place(fair: Fair) -> None:
    fair.r.set(LOCK, "x", px=10_000)
    # New places: nothing read; the first starts the queue (and gives it its expiry).
    ran = fair.ran(lambda: fair.join("a", mode="b"))
    assert not {"hget", "hgetall"} & set(ran) and ran.get("pexpire") == 1, ran
    ran = fair.ran(lambda: fair.join("b", mode="b"))
    assert not {"hget", "hgetall"} & set(ran), ran
    assert fair.queue() == [b"a", b"b"]
    # A refresh keeps its place (its own record is read: no second place).
    ran = fair.ran(lambda: fair.join("a", mode="b"))
    assert ran.get("hget") == 1 and ran.get("hset") == 1, ran
    assert fair.queue() == [b"a", b"b"]
    # The lock free: taken past the queue; a taker that had a place (a resend whose first send
    # joined) gives it up, and the others keep theirs.
    assert fair.join("c", mode="b")[0] == 0
    fair.r.delete(LOCK)
    assert isinstance(fair.join("b", mode="b"), int)
    assert fair.r.get(LOCK) == b"b"
    assert fair.queue() == [b"a", b"c"]
    assert fair.deadline("b") is None
    # Released: granted to a, then to c, the queue's last waiter.
    fair.release()
    assert fair.r.get(LOCK) == b"a"
    fair.release()
    assert fair.r.get(LOCK) == b"c"
    assert fair.r.exists(QUEUE) == 0


def test_a_release_that_grants_nothing_frees_the_lock(fair: Fair) -> None:
    """The grant writes over the released lock key; when there is nobody to grant it to (every
    place lapsed, or of another format), the release deletes the key and wakes all."""
    wake = fair.r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(CHANNEL)
    try:
        fair.r.set(LOCK, "x", px=10_000)
        for token in ("a", "b"):
            assert fair.join(token)[0] == 0
        fair.lapse("a", "b")
        fair.release()
        assert fair.r.exists(LOCK) == 0
        assert fair.r.exists(QUEUE) == 0
        fair.r.set(LOCK, "x", px=10_000)
        fair.r.hset(QUEUE, "foreign", "not a place")
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
    """A MultiLock's release hands each name on as lock_release.lua does: to the queue's first
    live waiter, taking its place out (the queue goes with its last place)."""
    release = fair.r.register_script(MULTI_RELEASE)
    other = ["t{n}:o", "t{n}:o:fence", "t{n}:o:lock:queue"]
    args = ["m", SLACK_MS, FENCE_TTL_MS, CHANNEL, "t{n}:o:wake"]
    fair.r.set(LOCK, "m", px=10_000)
    fair.r.set(other[0], "m", px=10_000)
    assert fair.join("a")[0] == 0
    ran = fair.ran(lambda: release(keys=[*KEYS, *other], args=args))
    assert fair.r.get(LOCK) == b"a" and fair.r.get(other[0]) is None
    assert fair.r.exists(QUEUE) == 0
    assert ran.get("del") == 1 and ran.get("hdel") == 1, ran  # (the del: other's lock)
    # Two queued: the head is taken out, the other keeps its place.
    fair.r.set(LOCK, "m", px=10_000)
    for token in ("b", "c"):
        assert fair.join(token)[0] == 0
    assert release(keys=[*KEYS, *other], args=args) == 1
    assert fair.r.get(LOCK) == b"b" and fair.queue() == [b"c"]
