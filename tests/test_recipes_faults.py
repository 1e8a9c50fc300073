"""The recipes (`acquire_lock` / `release_lock`, a caller-chosen identifier) under a connection
fault: the reply of a request that ran in Redis is lost (FaultProxy.drop_reply_to).

Every redis-server here is started by the test and stopped by its PID.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redmutex
from _proxy import FaultProxy, proxied_server
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)


class Setup:
    def __init__(self, server: RedisServer, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy
        self.redis = redis.Redis(port=server.port)

    def client(self, through_proxy: bool) -> redmutex.Client:
        url = self.proxy.url if through_proxy else self.server.url
        return redmutex.Client(url, prefix="p:", connect_timeout=1.0, command_timeout=1.0)

    def warmed_faulty_client(self) -> redmutex.Client:
        """A client through the proxy whose path is open (one acquire and release went through),
        so that a fault armed next hits the call under test, not the connection's first one."""
        faulty = self.client(True)
        assert redmutex.acquire_lock(faulty, "warm", "w") == "w"
        assert redmutex.release_lock(faulty, "warm", "w")
        return faulty

    def owner(self, name: str) -> bytes | None:
        value = self.redis.get(f"p:{{{name}}}:lock")
        return value if isinstance(value, bytes) else None


@pytest.fixture
def setup() -> Iterator[Setup]:
    with proxied_server() as (server, proxy):
        yield Setup(server, proxy)


def test_an_attempt_of_unknown_outcome_never_deletes_another_calls_lock(setup: Setup) -> None:
    # A holds the lock with identifier "X"; B tries the same identifier, its reply is lost and
    # its resend cut off (ConnectionError). B's clean-up must not delete the lock it finds
    # under "X": it may be A's (the recipes leave such a lock to lapse).
    faulty, direct, third = setup.warmed_faulty_client(), setup.client(False), setup.client(False)
    for i in range(3):
        name = f"same-id-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(direct, name, "X", 1, 10) == "X"
        setup.proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
        with pytest.raises(redmutex.ConnectionError):
            redmutex.acquire_lock(faulty, name, "X", 0, 10)
        setup.proxy.heal()
        setup.proxy.disarm()
        time.sleep(1.0)  # B's clean-up has run by now
        assert setup.owner(name) == b"X"
        assert redmutex.acquire_lock(third, name, "Z", 0.2, 10) is False
        assert redmutex.release_lock(direct, name, "X") is True


def test_a_release_whose_reply_was_lost_is_a_release(setup: Setup) -> None:
    # The delete ran, its reply was lost, the resend found nothing: that is this call's own
    # release (as for Lock.release), not "we lost the lock".
    client = setup.client(True)
    for i in range(3):
        name = f"lost-reply-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(client, name, "X", 1, 10) == "X"
        setup.proxy.drop_reply_to(f"{{{name}}}".encode())
        assert redmutex.release_lock(client, name, "X") is True
        setup.proxy.disarm()
        assert setup.owner(name) is None
    # The block's release goes the same way: no LockLostError for a lock kept all along.
    name = f"lost-reply-block-{uuid.uuid4().hex[:6]}"
    with redmutex.redis_lock(client, name, ltime=10):
        setup.proxy.drop_reply_to(f"{{{name}}}".encode())
    setup.proxy.disarm()
    assert setup.owner(name) is None
    # A lock whose lease ran out before the release is still reported lost.
    name = f"lapsed-{uuid.uuid4().hex[:6]}"
    assert redmutex.acquire_lock(client, name, "X", 1, 0.3) == "X"
    time.sleep(0.5)
    assert redmutex.release_lock(client, name, "X") is False


def test_a_release_retried_after_it_raised_is_a_release(setup: Setup) -> None:
    # The delete ran, its reply was lost and the resend cut off: release_lock raised
    # ConnectionError. Retried once the path is back, its "not ours" is that first send's
    # delete (the same server, inside the lease): True, as Lock.release counts it.
    client = setup.warmed_faulty_client()
    for i in range(3):
        name = f"retried-release-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(client, name, "X", 1, 10) == "X"
        setup.proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
        with pytest.raises(redmutex.ConnectionError):
            redmutex.release_lock(client, name, "X")
        setup.proxy.heal()
        setup.proxy.disarm()
        assert setup.owner(name) is None
        assert redmutex.release_lock(client, name, "X") is True
    # Once answered, the record is gone: a later release of the same identifier is not ours.
    assert redmutex.release_lock(client, name, "X") is False


def test_a_resent_attempt_never_takes_another_calls_lock_with_the_same_identifier(
    setup: Setup,
) -> None:
    # A holds the lock with identifier "X"; B tries the same identifier and its first reply is
    # lost. B's resend finds "X" in place: it cannot tell A's hold from one its first send set,
    # so it must not count it as its own (else A and B both hold the lock).
    faulty, direct = setup.warmed_faulty_client(), setup.client(False)
    granted = 0
    for i in range(5):
        name = f"resent-same-id-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(direct, name, "X", 1, 10) == "X"
        setup.proxy.drop_reply_to(f"{{{name}}}".encode())
        if redmutex.acquire_lock(faulty, name, "X", 0.3, 10) is not False:
            granted += 1
        setup.proxy.disarm()
        assert setup.owner(name) == b"X"
        assert redmutex.release_lock(direct, name, "X") is True
    assert granted == 0, f"{granted} of 5 resends took the other call's lock"


def test_a_resent_release_never_deletes_a_hold_taken_since_under_the_same_identifier(
    setup: Setup,
) -> None:
    # B releases "X"; the delete runs but its reply is lost, and before B's resend arrives
    # (requests delayed 0.3 s) A takes the free lock under "X" too. B's resend must not delete
    # A's hold: A would then believe it holds a lock that any third call can take.
    faulty, direct = setup.warmed_faulty_client(), setup.client(False)
    deleted = 0
    for i in range(5):
        name = f"resent-release-{i}-{uuid.uuid4().hex[:6]}"
        assert redmutex.acquire_lock(faulty, name, "X", 1, 10) == "X"
        taken: list[object] = []

        def take_once_released(name: str = name, taken: list[object] = taken) -> None:
            setup.proxy.reply_dropped.wait(5)
            taken.append(redmutex.acquire_lock(direct, name, "X", 0, 10))

        setup.proxy.set_latency(0.3, "c2s")
        setup.proxy.drop_reply_to(f"{{{name}}}".encode())
        other = threading.Thread(target=take_once_released)
        other.start()
        try:
            assert redmutex.release_lock(faulty, name, "X") is True
        finally:
            other.join(10)
            setup.proxy.set_latency(0, "c2s")
            setup.proxy.disarm()
        assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
        assert taken == ["X"]
        if setup.owner(name) != b"X":
            deleted += 1
        setup.redis.delete(f"p:{{{name}}}:lock")
    assert deleted == 0, f"{deleted} of 5 resent releases deleted the other call's hold"


def test_a_release_of_a_hold_taken_elsewhere_is_not_resent(setup: Setup) -> None:
    # A client that did not take the hold knows no fence to tell it from a later one under the
    # same identifier, so a release whose reply was lost is not resent: ConnectionError (the
    # delete may have run), never a resend that could delete another call's hold.
    faulty, direct = setup.warmed_faulty_client(), setup.client(False)
    name = f"released-elsewhere-{uuid.uuid4().hex[:6]}"
    assert redmutex.acquire_lock(direct, name, "X", 1, 10) == "X"
    setup.proxy.drop_reply_to(f"{{{name}}}".encode())
    with pytest.raises(redmutex.ConnectionError):
        redmutex.release_lock(faulty, name, "X")
    setup.proxy.disarm()
    assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
    assert setup.owner(name) is None  # the first send ran


def test_a_release_after_the_lease_ran_out_is_a_lost_lock_also_when_its_reply_was_lost(
    setup: Setup,
) -> None:
    # The control of test_a_release_whose_reply_was_lost_is_a_release: the lease had run out
    # before the release went out, so the key its resend finds gone (the fence counter still at
    # this hold's fence: nobody took the name since) may have lapsed by itself.
    client = setup.warmed_faulty_client()
    name = f"lapsed-lost-reply-{uuid.uuid4().hex[:6]}"
    assert redmutex.acquire_lock(client, name, "X", 1, 0.3) == "X"
    time.sleep(0.5)
    setup.proxy.drop_reply_to(f"{{{name}}}".encode())
    try:
        assert redmutex.release_lock(client, name, "X") is False
    finally:
        setup.proxy.disarm()
    assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
