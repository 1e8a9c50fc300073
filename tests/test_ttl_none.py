"""`ttl=None` is refused everywhere a lease is given (issue 14 item 2).

In redis-py and python-redis-lock `None` means "never expires"; here a lease is never infinite,
so `None` must not silently become the 10 s default: it is a TypeError naming the argument and
pointing to auto_renew. `extend(ttl=None)` keeps meaning "the object's own ttl".
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio

HINT = "auto_renew=True"


def refused(arg: str, make: Callable[[], Any]) -> None:
    with pytest.raises(TypeError) as info:
        make()
    message = str(info.value)
    assert message.startswith(f"{arg}:"), message
    assert "None" in message and HINT in message, message


def refused_async(arg: str, make: Callable[[], Any]) -> None:
    async def main() -> None:
        result = make()
        if inspect.isawaitable(result):
            await result

    refused(arg, lambda: asyncio.run(main()))


def fill() -> int:
    return 1


async def afill() -> int:
    return 1


def test_constructors_refuse_ttl_none(client: redmutex.Client) -> None:
    refused("ttl", lambda: redmutex.Lock(client, "a", ttl=None))  # type: ignore[arg-type]
    refused("ttl", lambda: redmutex.Semaphore(client, "a", 2, ttl=None))  # type: ignore[arg-type]
    refused("ttl", lambda: redmutex.RWLock(client, "a", ttl=None))  # type: ignore[arg-type]
    # with the other options too, and whatever else is given
    refused("ttl", lambda: redmutex.Lock(client, "a", ttl=None, auto_renew=True))  # type: ignore[arg-type]


def test_default_ttl_is_still_ten_seconds(client: redmutex.Client) -> None:
    assert redmutex.Lock(client, "a").ttl == 10.0
    assert redmutex.Semaphore(client, "a", 2).ttl == 10.0
    assert redmutex.RWLock(client, "a").ttl == 10.0
    assert redmutex.Lock(client, "a", ttl=3).ttl == 3.0
    # the signature says the default (not None)
    assert inspect.signature(redmutex.Lock).parameters["ttl"].default == 10.0
    assert inspect.signature(redmutex.Semaphore).parameters["ttl"].default == 10.0
    assert inspect.signature(redmutex.RWLock).parameters["ttl"].default == 10.0


def test_other_bad_ttls_keep_their_errors(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="^ttl"):
        redmutex.Lock(client, "a", ttl=-1)
    with pytest.raises(TypeError, match="^ttl"):
        redmutex.Lock(client, "a", ttl="10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^ttl"):
        redmutex.Lock(client, "a", ttl=True)
    with pytest.raises(ValueError, match="^ttl"):
        redmutex.Semaphore(client, "a", 1, ttl=float("inf"))


def test_none_keeps_meaning_the_default_elsewhere(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "a", timeout=None, replicas=None)  # type: ignore[arg-type]
    assert lock.acquire(timeout=None) is True
    lock.release()


def test_locked_decorator_refuses_ttl_none(client: redmutex.Client) -> None:
    refused("ttl", lambda: redmutex.locked(client, "a", ttl=None))  # type: ignore[arg-type]
    refused("ttl", lambda: aio.locked(client, "a", ttl=None))  # type: ignore[arg-type]


def test_cache_refuses_lock_ttl_none(client: redmutex.Client) -> None:
    def get() -> Any:
        return redmutex.get_or_fill(client, "k", fill, ttl=5, lock_ttl=None)  # type: ignore[arg-type]

    def decorated() -> Any:
        return redmutex.cached(client, ttl=5, lock_ttl=None)(fill)()  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="^lock_ttl: .*None"):
        get()
    with pytest.raises(TypeError, match="^lock_ttl: .*None"):
        decorated()

    async def aget() -> Any:
        return await aio.get_or_fill(client, "k", afill, ttl=5, lock_ttl=None)  # type: ignore[arg-type]

    async def adecorated() -> Any:
        return await aio.cached(client, ttl=5, lock_ttl=None)(afill)()  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="^lock_ttl: .*None"):
        asyncio.run(aget())
    with pytest.raises(TypeError, match="^lock_ttl: .*None"):
        asyncio.run(adecorated())
    # the default still works
    assert redmutex.get_or_fill(client, "k2", fill, ttl=5) == 1


def test_recipes_refuse_ltime_none(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    refused("ltime", lambda: redmutex.acquire_lock(client, "a", ltime=None))  # type: ignore[arg-type]

    def enter() -> None:
        with redmutex.redis_lock(client, "a", ltime=None):  # type: ignore[arg-type]
            pass

    refused("ltime", enter)
    assert r.exists(f"{prefix}{{a}}:lock") == 0  # nothing was taken


def test_aio_constructors_refuse_ttl_none(client: redmutex.Client) -> None:
    refused_async("ttl", lambda: aio.Lock(client, "a", ttl=None))  # type: ignore[arg-type]
    refused_async("ttl", lambda: aio.Semaphore(client, "a", 2, ttl=None))  # type: ignore[arg-type]
    refused_async("ttl", lambda: aio.RWLock(client, "a", ttl=None))  # type: ignore[arg-type]


def test_extend_none_is_the_objects_own_ttl(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    lock = redmutex.Lock(client, "e", ttl=30)
    assert lock.acquire()
    lock.extend(1)
    assert r.pttl(f"{prefix}{{e}}:lock") <= 1000
    lock.extend(None)
    assert r.pttl(f"{prefix}{{e}}:lock") > 20_000
    lock.release()

    sem = redmutex.Semaphore(client, "s", 2, ttl=30)
    assert sem.acquire()
    sem.extend(None)
    assert (sem.remaining() or 0) > 20
    sem.release()

    async def main() -> None:
        alock = aio.Lock(client, "ae", ttl=30)
        assert await alock.acquire()
        await alock.extend(1)
        assert r.pttl(f"{prefix}{{ae}}:lock") <= 1000
        await alock.extend(None)
        assert r.pttl(f"{prefix}{{ae}}:lock") > 20_000
        await alock.release()

    asyncio.run(main())
