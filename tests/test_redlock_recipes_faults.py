"""The recipes (`acquire_lock` / `release_lock`, a caller-chosen identifier) on a Redlock client
under a connection fault: each master's reply to the release is lost after the release ran there
(FaultProxy.drop_reply_to), and the master's resend must not delete what another call took since
under the same identifier.

Every redis-server here is started by the test (`Masters`) and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redmutex
import redmutex.aio
from _helpers import Paused
from _proxy import FaultProxy
from _scale_servers import Masters
from test_faults_interrupt import _interrupted, _sigint

pytestmark = pytest.mark.timeout(120)

FAST = {"connect_timeout": 1.0, "command_timeout": 1.0}


class Setup:
    """3 masters; `faulty` reaches each through its own FaultProxy, `direct` reaches them
    directly."""

    def __init__(self, masters: Masters, proxies: list[FaultProxy]) -> None:
        self.masters, self.proxies = masters, proxies
        self.faulty = redmutex.Client([p.url for p in proxies], prefix="p:", **FAST)
        self.direct = redmutex.Client(masters.urls, prefix="p:", **FAST)
        # Every connection through the proxies is open and the scripts are loaded, so that a
        # fault armed next hits the call under test.
        assert redmutex.acquire_lock(self.faulty, "warm", "w") == "w"
        assert redmutex.release_lock(self.faulty, "warm", "w") is True

    def owners(self, name: str) -> list[bytes | None]:
        found = []
        for i in range(len(self.masters.servers)):
            with self.masters.conn(i) as r:
                value = r.get(f"p:{{{name}}}:lock")
                found.append(value if isinstance(value, bytes) else None)
        return found

    def wait_held_everywhere(self, name: str, token: bytes) -> None:
        """A vote may still be on its way when the round was won: the fault must meet the
        release, not a late vote."""
        deadline = time.monotonic() + 5
        while self.owners(name) != [token] * len(self.masters.servers):
            assert time.monotonic() < deadline, "a master never granted"
            time.sleep(0.01)
        time.sleep(0.05)  # the fence write-backs have landed too


@pytest.fixture
def setup() -> Iterator[Setup]:
    with Masters(3) as masters, contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy(s.port)) for s in masters.servers]
        s = Setup(masters, proxies)
        try:
            yield s
        finally:
            s.faulty.close()
            s.direct.close()


def test_a_resent_release_never_deletes_a_hold_taken_since_under_the_same_identifier(
    setup: Setup,
) -> None:
    # B releases "X" on every master; each delete runs but its reply is lost, and before B's
    # resends arrive (requests delayed 0.3 s) A takes the free lock under "X" on a majority. B's
    # resends must not delete A's copies: A would then believe it holds a lock that any third
    # call can take.
    deleted = 0
    for i in range(5):
        name = f"rl-resent-release-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(setup.faulty, name, "X", 1, 10) == "X"
        setup.wait_held_everywhere(name, b"X")
        taken: list[object] = []

        def take_once_released(name: str = name, taken: list[object] = taken) -> None:
            for proxy in setup.proxies:
                proxy.reply_dropped.wait(5)
            taken.append(redmutex.acquire_lock(setup.direct, name, "X", 0, 10))

        for proxy in setup.proxies:
            proxy.set_latency(0.3, "c2s")
            proxy.drop_reply_to(f"{{{name}}}".encode())
        other = threading.Thread(target=take_once_released)
        other.start()
        try:
            # Its answer is not what this test is about; that it leaves A's copies is.
            redmutex.release_lock(setup.faulty, name, "X")
        finally:
            other.join(10)
            for proxy in setup.proxies:
                proxy.set_latency(0, "c2s")
                proxy.disarm()
        assert all(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
        assert taken == ["X"]
        time.sleep(0.5)  # A's late votes and B's resends have run by now
        deleted += sum(1 for owner in setup.owners(name) if owner != b"X")
        for m in range(len(setup.masters.servers)):
            with setup.masters.conn(m) as r:
                r.delete(f"p:{{{name}}}:lock")
    assert deleted == 0, f"B's resent releases deleted {deleted} of A's 15 copies"


def test_a_release_of_a_hold_taken_elsewhere_is_not_resent(setup: Setup) -> None:
    # A client that did not win the hold knows none of its fences to tell it from a later one
    # under the same identifier, so no master's delete is resent after its reply was lost: the
    # release is undecided (QuorumError; the deletes may have run), never a resend that could
    # delete another call's copy.
    name = f"rl-released-elsewhere-{uuid.uuid4().hex[:6]}"
    assert redmutex.acquire_lock(setup.direct, name, "X", 1, 10) == "X"
    setup.wait_held_everywhere(name, b"X")
    for proxy in setup.proxies:
        proxy.drop_reply_to(f"{{{name}}}".encode())
    try:
        with pytest.raises(redmutex.QuorumError):
            redmutex.release_lock(setup.faulty, name, "X")
    finally:
        for proxy in setup.proxies:
            proxy.disarm()
    assert all(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
    assert setup.owners(name) == [None, None, None]  # the first sends ran


def _release_with_every_reply_lost(setup: Setup, name: str, token: str) -> bool:
    """`release_lock` whose first send runs on every master while each reply is lost, so that
    every master's answer is its resend's."""
    for proxy in setup.proxies:
        proxy.drop_reply_to(f"{{{name}}}".encode())
    try:
        released = redmutex.release_lock(setup.faulty, name, token)
    finally:
        for proxy in setup.proxies:
            proxy.disarm()
    assert all(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
    return released


def test_a_release_whose_replies_were_lost_is_a_release(setup: Setup) -> None:
    # Each master's delete ran and its reply was lost; the resend finds the key gone while the
    # fence counter still reads this hold's fence (nobody took the name since), and the lease
    # was ours when the release went out: the first send deleted it. That is this call's own
    # release, not "we lost the lock".
    results = []
    for i in range(3):
        name = f"rl-lost-reply-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(setup.faulty, name, "X", 1, 10) == "X"
        setup.wait_held_everywhere(name, b"X")
        results.append(_release_with_every_reply_lost(setup, name, "X"))
        assert setup.owners(name) == [None, None, None]
    assert results == [True, True, True]


def test_a_release_after_the_lease_ran_out_is_still_a_lost_lock(setup: Setup) -> None:
    # The control: the lease had run out before the release went out, so the key the resend
    # finds gone may have lapsed by itself: the lock is reported lost.
    name = f"rl-lapsed-{uuid.uuid4().hex[:6]}"
    assert redmutex.acquire_lock(setup.faulty, name, "X", 1, 0.3) == "X"
    setup.wait_held_everywhere(name, b"X")
    time.sleep(0.5)
    assert setup.owners(name) == [None, None, None]
    assert _release_with_every_reply_lost(setup, name, "X") is False


# A drawn identifier (`acquire_lock` without one, `redis_lock`) is nobody else's: on a Redlock
# client it goes as a Lock's token, so a vote of unknown outcome (its reply lost, or late past
# the command timeout) is given back by identifier, and a resend that finds it counts its grant.

LTIME = 8.0  # the orphaned votes' lease: what another caller waited before the give-back
SOON = 4.0  # how long another caller may wait instead (generous: a noisy 2-core machine)


def _other_caller_waits(setup: Setup, name: str) -> float:
    """Seconds another client waited for `name`; fails when it did not get it within SOON."""
    started = time.monotonic()
    identifier = redmutex.acquire_lock(setup.direct, name, atime=SOON, ltime=1)
    waited = time.monotonic() - started
    assert identifier, (
        f"{name}: another caller waited {SOON} s in vain, owners {setup.owners(name)}"
    )
    assert redmutex.release_lock(setup.direct, name, identifier)
    return waited


def _acquire_lock(client: redmutex.Client, name: str) -> object:
    return redmutex.acquire_lock(client, name, atime=0, ltime=LTIME)


def _enter_redis_lock(client: redmutex.Client, name: str) -> object:
    with redmutex.redis_lock(client, name, atime=0, ltime=LTIME) as identifier:
        return identifier


def _lock_acquire(client: redmutex.Client, name: str) -> object:
    return redmutex.Lock(client, name, ttl=LTIME).acquire(blocking=False)


@pytest.mark.parametrize("acquire", [_acquire_lock, _enter_redis_lock, _lock_acquire])
def test_a_drawn_identifier_whose_votes_were_lost_is_given_back(
    setup: Setup, acquire: Callable[[redmutex.Client, str], object]
) -> None:
    # Every master sets the identifier, its reply is lost and the resend black-holed: no
    # majority answered (QuorumError). Before, a recipe's votes were not given back at all, and
    # a Lock's give-back was sent once: lost too when it went out before the masters could be
    # reached again (its new connection cut with the black hole), leaving the name held on a
    # majority until the lease ended. Such a give-back is now sent again until it lands.
    for i in range(4):
        name = f"rl-drawn-lost-{i}-{uuid.uuid4().hex[:6]}"
        for proxy in setup.proxies:
            proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
        try:
            with pytest.raises(redmutex.QuorumError):
                acquire(setup.faulty, name)
        finally:
            for proxy in setup.proxies:
                proxy.heal()
                proxy.disarm()
        assert all(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
        assert _other_caller_waits(setup, name) < SOON


def test_a_cancelled_acquire_whose_votes_were_lost_is_given_back(setup: Setup) -> None:
    # As above, but the acquire is cancelled (its asyncio task) while the resends wait in the
    # black hole: its give-back goes out while no master can be reached. Before, it was sent
    # once (lost), and the drawn token held the name on every master for the whole ttl: 3 of 3
    # probe runs.
    for i in range(2):
        name = f"rl-drawn-cancelled-{i}-{uuid.uuid4().hex[:6]}"
        for proxy in setup.proxies:
            proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)

        async def cancelled(name: str = name) -> None:
            lock = redmutex.aio.Lock(setup.faulty, name, ttl=LTIME)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lock.acquire(timeout=5), 0.5)

        try:
            asyncio.run(cancelled())
            time.sleep(1.0)  # the give-back has gone out, into the black hole
        finally:
            for proxy in setup.proxies:
                proxy.heal()
                proxy.disarm()
        assert all(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
        assert _other_caller_waits(setup, name) < SOON


def test_a_drawn_identifier_whose_votes_came_too_late_is_given_back(setup: Setup) -> None:
    # Every master ran the vote, but its reply comes after the command timeout.
    for i in range(3):
        name = f"rl-drawn-late-{i}-{uuid.uuid4().hex[:6]}"
        for proxy in setup.proxies:
            proxy.set_latency(1.5, "s2c")
        try:
            with pytest.raises(redmutex.QuorumError):
                redmutex.acquire_lock(setup.faulty, name, atime=0, ltime=LTIME)
        finally:
            for proxy in setup.proxies:
                proxy.set_latency(0, "s2c")
        assert _other_caller_waits(setup, name) < SOON


def test_a_drawn_identifier_whose_first_replies_were_lost_takes_its_own_grants(
    setup: Setup,
) -> None:
    # Every master's reply is lost and its resend finds the drawn identifier in place, which
    # only this call's first send can have set: the call holds the lock. Before, each master
    # counted as busy: False at once, and the name held until `ltime` with nobody to release it.
    for i in range(3):
        name = f"rl-drawn-resent-{i}-{uuid.uuid4().hex[:6]}"
        for proxy in setup.proxies:
            proxy.drop_reply_to(f"{{{name}}}".encode())
        try:
            identifier = redmutex.acquire_lock(setup.faulty, name, atime=0, ltime=LTIME)
        finally:
            for proxy in setup.proxies:
                proxy.disarm()
        assert any(p.reply_dropped.is_set() for p in setup.proxies), "the test proved nothing"
        assert isinstance(identifier, str)
        setup.wait_held_everywhere(name, identifier.encode())
        assert redmutex.release_lock(setup.faulty, name, identifier) is True
        assert setup.owners(name) == [None, None, None]


def test_a_drawn_identifiers_release_whose_replies_were_lost_is_a_release(setup: Setup) -> None:
    # As for a chosen identifier above: each master's delete ran and its reply was lost; the
    # resend finds the identifier gone, and the release went out while the lease was ours.
    for i in range(3):
        name = f"rl-drawn-release-lost-{i}-{uuid.uuid4().hex[:6]}"
        identifier = redmutex.acquire_lock(setup.faulty, name, atime=1, ltime=10)
        assert isinstance(identifier, str)
        setup.wait_held_everywhere(name, identifier.encode())
        assert _release_with_every_reply_lost(setup, name, identifier) is True
        assert setup.owners(name) == [None, None, None]


def test_a_chosen_identifiers_lost_votes_are_not_given_back(setup: Setup) -> None:
    # The control: a caller-chosen identifier found in place may be another call's hold, so the
    # votes whose replies were lost are left to lapse after `ltime`.
    name = f"rl-chosen-lost-{uuid.uuid4().hex[:6]}"
    for proxy in setup.proxies[:2]:
        proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
    try:
        with pytest.raises(redmutex.QuorumError):
            redmutex.acquire_lock(setup.faulty, name, "X", atime=0, ltime=LTIME)
    finally:
        for proxy in setup.proxies:
            proxy.heal()
            proxy.disarm()
    time.sleep(1.5)  # a give-back would have landed by now
    assert setup.owners(name)[:2] == [b"X", b"X"]


def test_an_interrupted_acquire_lock_is_given_back(setup: Setup) -> None:
    # Masters 0 and 1 are paused, so their votes are out when Ctrl-C ends the call; once they
    # run, the drawn identifier holds the name on a majority. Before, the cancelled acquire gave
    # back only where a grant had been heard (none), leaving it there for `ltime`.
    for i in range(3):
        name = f"rl-drawn-interrupted-{i}-{uuid.uuid4().hex[:6]}"
        servers = setup.masters.servers
        with Paused(servers[0]) as first, Paused(servers[1]) as second:

            def call(name: str = name) -> object:
                return redmutex.acquire_lock(setup.direct, name, atime=10, ltime=LTIME)

            outcome, _ = _interrupted(call, _sigint)
            first.resume()
            second.resume()
        assert outcome == "interrupt", outcome
        assert _other_caller_waits(setup, name) < SOON
