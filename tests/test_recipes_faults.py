"""The recipes (`acquire_lock` / `release_lock`, a caller-chosen identifier) under a connection
fault: the reply of a request that ran in Redis is lost (FaultProxy.drop_reply_to).

Every redis-server here is started by the test and stopped by its PID.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redmutex
from _proxy import FaultProxy
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)


class Setup:
    def __init__(self, server: RedisServer, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy
        self.redis = redis.Redis(port=server.port)

    def client(self, through_proxy: bool) -> redmutex.Client:
        url = self.proxy.url if through_proxy else self.server.url
        return redmutex.Client(url, prefix="p:", connect_timeout=1.0, command_timeout=1.0)

    def owner(self, name: str) -> bytes | None:
        value = self.redis.get(f"p:{{{name}}}:lock")
        return value if isinstance(value, bytes) else None


@pytest.fixture
def setup() -> Iterator[Setup]:
    server = RedisServer().start()
    try:
        with FaultProxy(server.port) as proxy:
            yield Setup(server, proxy)
    finally:
        server.stop()


def test_an_attempt_of_unknown_outcome_never_deletes_another_calls_lock(setup: Setup) -> None:
    # A holds the lock with identifier "X"; B tries the same identifier, its reply is lost and
    # its resend cut off (ConnectionError). B's clean-up must not delete the lock it finds
    # under "X": it may be A's (the recipes leave such a lock to lapse).
    faulty, direct, third = setup.client(True), setup.client(False), setup.client(False)
    assert redmutex.acquire_lock(faulty, "warm", "w") == "w"  # the proxy path is open
    assert redmutex.release_lock(faulty, "warm", "w")
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


def test_a_resent_attempt_never_takes_another_calls_lock_with_the_same_identifier(
    setup: Setup,
) -> None:
    # A holds the lock with identifier "X"; B tries the same identifier and its first reply is
    # lost. B's resend finds "X" in place: it cannot tell A's hold from one its first send set,
    # so it must not count it as its own (else A and B both hold the lock).
    faulty, direct = setup.client(True), setup.client(False)
    assert redmutex.acquire_lock(faulty, "warm", "w") == "w"  # the proxy path is open
    assert redmutex.release_lock(faulty, "warm", "w")
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
