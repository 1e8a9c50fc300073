"""The recipes give back an acquire whose outcome is unknown: `acquire_lock` without an
identifier (and `redis_lock`) that raised ConnectionError after its request took the lock in
Redis must not leave the name held until `ltime` ends, with nobody able to release it.

The faults come from FaultProxy: the attempt's reply is dropped and its resend black-holed, or
every reply is delayed past the command timeout. Every redis-server here is started by the test
and stopped by its PID.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from _proxy import FaultProxy, proxied_server
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)

LTIME = 8.0  # the orphan's lease: what another caller waited before the give-back
SOON = 4.0  # how long another caller may wait instead (generous: a noisy 2-core CI machine)
ROUNDS = 3


class Setup:
    def __init__(self, server: RedisServer, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy
        self.redis = redis.Redis(port=server.port)
        self.direct = self.client(self.server.url)

    def client(self, url: str) -> redmutex.Client:
        return redmutex.Client(url, prefix="p:", connect_timeout=1.0, command_timeout=1.0)

    def warmed_faulty_client(self) -> redmutex.Client:
        """A client through the proxy whose path is open, so that a fault armed next hits the
        call under test, not the connection's first one."""
        faulty = self.client(self.proxy.url)
        assert redmutex.acquire_lock(faulty, "warm", "w") == "w"
        assert redmutex.release_lock(faulty, "warm", "w")
        return faulty

    def wait_for_other_caller(self, name: str) -> float:
        """Seconds another caller waited for `name`; fails when it did not get it in SOON."""
        started = time.monotonic()
        identifier = redmutex.acquire_lock(self.direct, name, atime=SOON, ltime=1)
        waited = time.monotonic() - started
        assert identifier, f"{name}: another caller waited {SOON} s in vain (lease {LTIME} s)"
        assert redmutex.release_lock(self.direct, name, identifier)
        return waited


@pytest.fixture
def setup() -> Iterator[Setup]:
    with proxied_server() as (server, proxy):
        yield Setup(server, proxy)


def reply_lost(setup: Setup, acquire: Callable[[redmutex.Client, str], object]) -> float:
    """One round: `acquire` takes a free name, its reply is lost and its resend black-holed, so
    it raises ConnectionError; then how long another caller waits for the name."""
    faulty = setup.warmed_faulty_client()
    name = f"lost-{uuid.uuid4().hex[:8]}"
    setup.proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
    try:
        with pytest.raises(redmutex.ConnectionError):
            acquire(faulty, name)
    finally:
        setup.proxy.heal()
        setup.proxy.disarm()
    assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
    faulty.close()
    return setup.wait_for_other_caller(name)


def reply_late(setup: Setup) -> float:
    """One round: every reply comes after the command timeout, so `acquire_lock` raises
    ConnectionError (timed out) though its script ran; then how long another caller waits."""
    faulty = setup.warmed_faulty_client()
    name = f"late-{uuid.uuid4().hex[:8]}"
    setup.proxy.set_latency(1.5, "s2c")
    try:
        with pytest.raises(redmutex.ConnectionError):
            redmutex.acquire_lock(faulty, name, atime=0, ltime=LTIME)
        # Its grant made the name's fence counter: the attempt ran in Redis.
        assert setup.redis.exists(f"p:{{{name}}}:fence")
    finally:
        setup.proxy.set_latency(0, "s2c")
    faulty.close()
    return setup.wait_for_other_caller(name)


def acquire_lock_once(client: redmutex.Client, name: str) -> object:
    return redmutex.acquire_lock(client, name, atime=0, ltime=LTIME)


def enter_redis_lock(client: redmutex.Client, name: str) -> object:
    with redmutex.redis_lock(client, name, atime=0, ltime=LTIME) as identifier:
        return identifier


def test_acquire_lock_whose_reply_was_lost_gives_the_name_back(setup: Setup) -> None:
    for _ in range(ROUNDS):
        assert reply_lost(setup, acquire_lock_once) < SOON


def test_redis_lock_whose_reply_was_lost_gives_the_name_back(setup: Setup) -> None:
    for _ in range(ROUNDS):
        assert reply_lost(setup, enter_redis_lock) < SOON


def test_acquire_lock_whose_reply_came_too_late_gives_the_name_back(setup: Setup) -> None:
    for _ in range(ROUNDS):
        assert reply_late(setup) < SOON


def test_acquire_lock_whose_first_reply_was_lost_takes_its_own_grant(setup: Setup) -> None:
    # The reply is lost but the resend gets through: it finds the drawn identifier in place,
    # which only this call's first send can have set, so the call holds the lock (before, it
    # counted it busy: False, and the name held until `ltime`).
    faulty = setup.warmed_faulty_client()
    for _ in range(ROUNDS):
        name = f"resent-{uuid.uuid4().hex[:8]}"
        setup.proxy.drop_reply_to(f"{{{name}}}".encode())
        try:
            identifier = redmutex.acquire_lock(faulty, name, atime=0, ltime=LTIME)
        finally:
            setup.proxy.disarm()
        assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
        assert identifier
        assert setup.redis.get(f"p:{{{name}}}:lock") == identifier.encode()
        assert redmutex.release_lock(faulty, name, identifier)


def test_a_chosen_identifier_is_not_given_back(setup: Setup) -> None:
    # The control: with an identifier the caller chose, the hold its lost reply took may as
    # well be another call's under the same identifier; it is left to lapse after its `ltime`.
    faulty = setup.warmed_faulty_client()
    name = f"chosen-{uuid.uuid4().hex[:8]}"
    setup.proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
    try:
        with pytest.raises(redmutex.ConnectionError):
            redmutex.acquire_lock(faulty, name, "X", atime=0, ltime=LTIME)
    finally:
        setup.proxy.heal()
        setup.proxy.disarm()
    time.sleep(1.0)  # a give-back would have landed by now
    assert setup.redis.get(f"p:{{{name}}}:lock") == b"X"
