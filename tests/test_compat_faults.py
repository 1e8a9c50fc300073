"""The drop-in shims (`redmutex.compat`) with a token the caller chose (redis-py's `token=`,
python-redis-lock's `id=`) under a connection fault: the reply of a release that ran in Redis is
lost (FaultProxy.drop_reply_to), and its resend must not delete the hold that another call took
since under the same token.

Every redis-server here is started by the test and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio
import redmutex
from _proxy import FaultProxy, proxied_server
from redis.exceptions import LockNotOwnedError
from redmutex._server import RedisServer
from redmutex.compat import redis_lock, redis_py
from redmutex.compat.redis_py import asyncio as redis_py_aio

pytestmark = pytest.mark.timeout(120)

ROUNDS = 5


class Setup:
    def __init__(self, server: RedisServer, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy
        self.faulty = redis.Redis(port=proxy.port, socket_timeout=5)
        self.direct = redis.Redis(port=server.port, socket_timeout=5)

    def warm(self) -> None:
        """The shims' connections through the proxy are open and their scripts loaded, so that
        a fault armed next hits the release under test."""
        for lk in (
            redis_py.Lock(self.faulty, "warm", timeout=5),
            redis_lock.Lock(self.faulty, "w"),
        ):
            assert lk.acquire(blocking=False)
            lk.release()

    def resend_meets_a_new_hold(
        self, marker: str, release: Callable[[], None], take: Callable[[], bool]
    ) -> None:
        """`release` runs with its reply lost and its requests delayed 0.3 s; once the reply
        was dropped (the release ran), `take` takes the free lock under the same token, before
        the release's resend arrives."""
        taken: list[bool] = []

        def take_once_released() -> None:
            self.proxy.reply_dropped.wait(5)
            taken.append(take())

        self.proxy.set_latency(0.3, "c2s")
        self.proxy.drop_reply_to(marker.encode())
        other = threading.Thread(target=take_once_released)
        other.start()
        try:
            # Whether the release reports "not owned" is not what this test is about: that it
            # leaves the other call's hold alone is.
            with contextlib.suppress(LockNotOwnedError, redis_lock.NotAcquired):
                release()
        finally:
            other.join(10)
            self.proxy.set_latency(0, "c2s")
            self.proxy.disarm()
        assert self.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
        assert taken == [True]
        time.sleep(0.5)  # the resend has run by now

    def rounds_keep_the_other_hold(self, prefix: str, one_round: Callable[[str], str]) -> None:
        """Runs `one_round(name)` ROUNDS times, each on a new name; it returns the lock key, which
        must still hold the other call's token "X" after the release's resend."""
        deleted = 0
        for i in range(ROUNDS):
            key = one_round(f"{prefix}-{i}-{uuid.uuid4().hex[:6]}")
            if self.direct.get(key) != b"X":
                deleted += 1
            self.direct.delete(key)
        assert deleted == 0, f"{deleted} of {ROUNDS} resent releases deleted the other call's hold"


@pytest.fixture
def setup() -> Iterator[Setup]:
    with proxied_server() as (server, proxy):
        s = Setup(server, proxy)
        s.warm()
        yield s
        s.faulty.close()
        s.direct.close()


def test_redis_py_a_resent_release_never_deletes_a_hold_taken_since_with_the_same_token(
    setup: Setup,
) -> None:
    def one_round(name: str) -> str:
        b = redis_py.Lock(setup.faulty, name, timeout=10)
        assert b.acquire(blocking=False, token="X")
        a = redis_py.Lock(setup.direct, name, timeout=10)
        setup.resend_meets_a_new_hold(name, b.release, lambda: a.acquire(blocking=False, token="X"))
        return name

    setup.rounds_keep_the_other_hold("cf-rp", one_round)


def test_redis_py_asyncio_a_resent_release_never_deletes_a_hold_taken_since(
    setup: Setup,
) -> None:
    def one_round(name: str) -> str:
        async def take_then_release() -> None:
            faulty = redis.asyncio.Redis(port=setup.proxy.port)
            try:
                b = redis_py_aio.Lock(faulty, name, timeout=10, thread_local=False)
                assert await b.acquire(blocking=False, token="X")
                loop = asyncio.get_running_loop()
                a = redis_py.Lock(setup.direct, name, timeout=10)
                await loop.run_in_executor(
                    None,
                    lambda: setup.resend_meets_a_new_hold(
                        name,
                        lambda: asyncio.run_coroutine_threadsafe(b.release(), loop).result(),
                        lambda: a.acquire(blocking=False, token="X"),
                    ),
                )
            finally:
                await faulty.aclose()

        asyncio.run(take_then_release())
        return name

    setup.rounds_keep_the_other_hold("cf-rpa", one_round)


def test_redis_lock_a_resent_release_never_deletes_a_hold_taken_since_with_the_same_id(
    setup: Setup,
) -> None:
    def one_round(name: str) -> str:
        b = redis_lock.Lock(setup.faulty, name, expire=10, id="X")
        assert b.acquire(blocking=False)
        a = redis_lock.Lock(setup.direct, name, expire=10, id="X")
        setup.resend_meets_a_new_hold(f"lock:{name}", b.release, lambda: a.acquire(blocking=False))
        return f"lock:{name}"

    setup.rounds_keep_the_other_hold("cf-rl", one_round)


def test_a_release_of_a_hold_taken_elsewhere_is_not_resent(setup: Setup) -> None:
    # A release by token of a hold this process did not take through that client (redis-py's
    # do_release, python-redis-lock's Lock(id=...).release() from elsewhere) knows no fence to
    # tell it from a later hold under the same token: a release whose reply was lost is not
    # resent, ConnectionError (the delete may have run), never a resend that could delete
    # another call's hold.
    name = f"cf-elsewhere-{uuid.uuid4().hex[:6]}"
    assert redis_py.Lock(setup.direct, name, timeout=10).acquire(blocking=False, token="X")
    setup.proxy.drop_reply_to(name.encode())
    with pytest.raises(redmutex.ConnectionError):
        redis_py.Lock(setup.faulty, name).do_release(b"X")
    setup.proxy.disarm()
    assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
    assert setup.direct.get(name) is None  # the first send ran

    assert redis_lock.Lock(setup.direct, name, expire=10, id="X").acquire(blocking=False)
    setup.proxy.drop_reply_to(f"lock:{name}".encode())
    with pytest.raises(redmutex.ConnectionError):
        redis_lock.Lock(setup.faulty, name, id="X").release()
    setup.proxy.disarm()
    assert setup.proxy.reply_dropped.is_set(), "no reply was dropped: the test proved nothing"
    assert setup.direct.get(f"lock:{name}") is None
