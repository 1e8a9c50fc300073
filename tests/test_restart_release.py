"""A release that got no answer because the server went down, retried once it is back.

The first send may have deleted the token before the server died: with its data kept (AOF,
`appendfsync always`), the restarted server shows the hold gone, and the retry's "not ours" is
that delete's work, not a loss. It is told from a loss by the fencing counter: still the hold's
own fence means nobody took the name since. A restart that lost the data (no persistence), or
another holder since, still makes the hold lost. (A restarted server has another run_id, so the
rule for one incarnation, "sent inside the lease counts as released", cannot decide it.)

Here the landed first send is played by a DEL of the lock key before the server is killed; the
release that follows meets the server down and raises ConnectionError, unanswered.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
import redis
import redmutex
import redmutex.aio
from redmutex._server import RedisServer

KEPT = ["--appendonly", "yes", "--appendfsync", "always"]
TTL = 30.0


def _kill(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=10)


def _client(server: RedisServer, prefix: str) -> redmutex.Client:
    # Short timeouts: a call meeting the server down gives up soon.
    return redmutex.Client(server.url, prefix=prefix, connect_timeout=0.3, command_timeout=2)


def _landed_then_down(server: RedisServer, lock_key: bytes) -> None:
    """The first send's delete lands, then the server dies."""
    admin = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        assert admin.delete(lock_key) == 1
    finally:
        admin.close()
    _kill(server)


def _taken_since(server: RedisServer, prefix: str) -> None:
    """Another client takes the name and gives it back: the fence counter moves on."""
    with _client(server, prefix) as other, redmutex.Lock(other, "n", ttl=5):
        pass


@pytest.fixture(params=["kept", "lost", "taken-since"])
def then(request: pytest.FixtureRequest) -> str:
    """What happened before the retry: the server kept its data, lost it, or kept it and the
    name was taken and given back since."""
    return str(request.param)


@pytest.fixture
def server(make_server: Callable[..., RedisServer], then: str) -> RedisServer:
    return make_server(extra_args=KEPT if then != "lost" else None)


KeyOf = Callable[[str, str], bytes]


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_lock_release_retried_after_a_restart(
    server: RedisServer, prefix: str, key_of: KeyOf, then: str, fair: bool
) -> None:
    with _client(server, prefix) as c:
        lock = redmutex.Lock(c, "n", ttl=TTL, fair=fair)
        assert lock.acquire(timeout=5)
        _landed_then_down(server, key_of("n", "lock"))
        with pytest.raises(redmutex.ConnectionError):
            lock.release()
        server.start()
        if then == "taken-since":
            _taken_since(server, prefix)
        if then == "kept":
            lock.release()
            assert not lock.lost
        else:
            with pytest.raises(redmutex.LockLostError):
                lock.release()
            assert lock.lost
        assert not lock.owned()


def test_aio_lock_release_retried_after_a_restart(
    server: RedisServer, prefix: str, key_of: KeyOf, then: str
) -> None:
    async def main() -> None:
        with _client(server, prefix) as c:
            lock = redmutex.aio.Lock(c, "n", ttl=TTL)
            assert await lock.acquire(timeout=5)
            _landed_then_down(server, key_of("n", "lock"))
            with pytest.raises(redmutex.ConnectionError):
                await lock.release()
            server.start()
            if then == "taken-since":
                _taken_since(server, prefix)
            if then == "kept":
                await lock.release()
                assert not lock.lost
            else:
                with pytest.raises(redmutex.LockLostError):
                    await lock.release()
                assert lock.lost

    asyncio.run(asyncio.wait_for(main(), 60))


def _both_landed_then_down(server: RedisServer, key_of: KeyOf) -> None:
    """A MultiLock release's first send deletes both names, then the server dies."""
    admin = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        assert admin.delete(key_of("m", "lock")) == 1
    finally:
        admin.close()
    _landed_then_down(server, key_of("n", "lock"))


def test_multilock_release_retried_after_a_restart(
    server: RedisServer, prefix: str, key_of: KeyOf, then: str
) -> None:
    """Every name's fence counter must still read the hold's fence for the release to count
    (taken-since takes one of the two names)."""
    with _client(server, prefix) as c:
        both = redmutex.MultiLock(c, ["n", "m"], ttl=TTL)
        assert both.acquire(timeout=5)
        _both_landed_then_down(server, key_of)
        with pytest.raises(redmutex.ConnectionError):
            both.release()
        server.start()
        if then == "taken-since":
            _taken_since(server, prefix)
        if then == "kept":
            both.release()
            assert not both.lost
        else:
            with pytest.raises(redmutex.LockLostError):
                both.release()
            assert both.lost
        assert not both.owned()


def test_aio_multilock_release_retried_after_a_restart(
    server: RedisServer, prefix: str, key_of: KeyOf, then: str
) -> None:
    async def main() -> None:
        with _client(server, prefix) as c:
            both = redmutex.aio.MultiLock(c, ["n", "m"], ttl=TTL)
            assert await both.acquire(timeout=5)
            _both_landed_then_down(server, key_of)
            with pytest.raises(redmutex.ConnectionError):
                await both.release()
            server.start()
            if then == "taken-since":
                _taken_since(server, prefix)
            if then == "kept":
                await both.release()
                assert not both.lost
            else:
                with pytest.raises(redmutex.LockLostError):
                    await both.release()
                assert both.lost

    asyncio.run(asyncio.wait_for(main(), 60))


def test_release_lock_retried_after_a_restart(
    server: RedisServer, prefix: str, key_of: KeyOf, then: str
) -> None:
    """The classic recipe: release_lock is True ("released"), or False ("we lost the lock")."""
    with _client(server, prefix) as c:
        identifier = redmutex.acquire_lock(c, "n", atime=5, ltime=TTL)
        assert isinstance(identifier, str)
        _landed_then_down(server, key_of("n", "lock"))
        with pytest.raises(redmutex.ConnectionError):
            redmutex.release_lock(c, "n", identifier)
        server.start()
        if then == "taken-since":
            _taken_since(server, prefix)
        assert redmutex.release_lock(c, "n", identifier) is (then == "kept")


def test_without_a_fault_a_gone_token_is_still_lost(
    r: redis.Redis, client: redmutex.Client, key_of: KeyOf
) -> None:
    """The control: with no release unanswered and no restart, a token gone before its lease
    ended was taken away (here by a DEL), even though the fence counter did not move."""
    identifier = redmutex.acquire_lock(client, "m", atime=5, ltime=TTL)
    assert isinstance(identifier, str)
    r.delete(key_of("m", "lock"))
    assert redmutex.release_lock(client, "m", identifier) is False
    lock = redmutex.Lock(client, "o", ttl=TTL)
    assert lock.acquire(timeout=5)
    r.delete(key_of("o", "lock"))
    with pytest.raises(redmutex.LockLostError):
        lock.release()
