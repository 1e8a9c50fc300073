"""`Client.close()` (and leaving `with Client(...)`) drops the client's wake-up subscriber
connections too. Each closed client that had a waiter left one open on its server (asyncio on
one server; blocking and asyncio on every Redlock master), for good: the task reading it held
its hub alive (an audit counted 10 of 10 per master after 3 s)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import pytest
import redis
import redmutex
from _helpers import wait_until
from redmutex import aio
from redmutex._server import RedisServer


def _subscribers(conns: list[redis.Redis]) -> list[int]:
    return [
        sum("flags=P" in line for line in str(c.execute_command("CLIENT", "LIST")).splitlines())
        for c in conns
    ]


def _wait_then_close(target: str | list[str], api: str) -> None:
    """A client that waited (subscribed for wake-ups) and was closed."""
    with redmutex.Client(target) as client:
        if api == "aio":

            async def wait() -> bool:
                return await aio.Lock(client, "close-subscribers", ttl=5).acquire(timeout=0.05)

            assert not asyncio.run(wait())
        else:
            assert not redmutex.Lock(client, "close-subscribers", ttl=5).acquire(timeout=0.05)


@pytest.mark.parametrize("deployment", ["one server", "redlock"])
@pytest.mark.parametrize("api", ["blocking", "aio"])
def test_closed_clients_leave_no_subscriber_connection(
    redis_url: str, make_server: Callable[..., RedisServer], deployment: str, api: str
) -> None:
    if deployment == "redlock":
        urls = [make_server().url for _ in range(3)]
        target: str | list[str] = urls
    else:
        urls, target = [redis_url], redis_url
    conns = [redis.Redis.from_url(u, decode_responses=True) for u in urls]
    holder_client = redmutex.Client(target)
    holder = redmutex.Lock(holder_client, "close-subscribers", ttl=30)
    assert holder.acquire(timeout=5)
    try:
        before = _subscribers(conns)
        for _ in range(5):
            _wait_then_close(target, api)
        gc.collect()
        time.sleep(0.5)
        wait_until(
            lambda: all(a <= b for a, b in zip(_subscribers(conns), before)),
            5,
            "the closed clients' subscriber connections to end",
        )
    finally:
        holder.release()
        holder_client.close()
        for c in conns:
            c.close()
