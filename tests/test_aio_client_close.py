"""A closed (or dropped) Client leaves no connection of its own open on a running event loop.

`redmutex.aio` opens one connection per event loop and client for its one-round-trip steps.
`Client.close()` (and leaving `with Client(...)`) closed the runtime's connections but not that
one, and a dropped client's stayed too, for as long as the loop ran: an async server making a
Client per request would grow its connections toward `maxclients`.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest
import redis
import redmutex
from redmutex import _aio_bridge, aio
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(60)

ROUNDS = 10


def _connections(r: redis.Redis) -> int:
    """Clients connected to the server, this one left out."""
    return len(r.client_list()) - 1


async def _settle(r: redis.Redis, at_most: int) -> int:
    """The connection count once it fell to `at_most`, or after a second."""
    for _ in range(50):
        if _connections(r) <= at_most:
            break
        await asyncio.sleep(0.02)
    return _connections(r)


@pytest.mark.parametrize("how", ["close", "with"])
def test_a_closed_client_closes_its_loop_connection(
    make_server: Callable[..., RedisServer], how: str
) -> None:
    server = make_server()
    r = redis.Redis(port=server.port)

    async def main() -> int:
        for i in range(ROUNDS):
            if how == "with":
                with redmutex.Client(server.url) as c:
                    async with aio.Lock(c, f"n{i}", ttl=5):
                        pass
            else:
                c = redmutex.Client(server.url)
                async with aio.Lock(c, f"n{i}", ttl=5):
                    pass
                c.close()
        return await _settle(r, 0)

    try:
        assert asyncio.run(main()) == 0
    finally:
        r.close()


def test_a_dropped_clients_loop_connection_does_not_outlive_the_next_client(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server()
    r = redis.Redis(port=server.port)

    async def main() -> int:
        for i in range(ROUNDS):
            c = redmutex.Client(server.url)
            lock = aio.Lock(c, f"n{i}", ttl=5)
            async with lock:
                pass
            del c, lock
            gc.collect()
        # The last client's connections may stay until another client opens one.
        return await _settle(r, 3)

    try:
        assert asyncio.run(main()) <= 3

        # Nor is a dropped client's connection remembered for its close, once it is gone (a
        # connection lives on for a command timeout after its last call, and is forgotten when
        # the next one opens).
        async def one_more() -> None:
            async with aio.Lock(redmutex.Client(server.url), "last", ttl=5):
                pass

        gc.collect()
        asyncio.run(one_more())
        assert len(_aio_bridge._client_conns) <= 2
    finally:
        r.close()


def test_a_closed_client_is_still_usable_on_the_loop(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server()

    async def main() -> None:
        c = redmutex.Client(server.url)
        lock = aio.Lock(c, "again", ttl=5)
        for _ in range(3):
            async with lock:
                assert await lock.owned()
            c.close()

    asyncio.run(main())
