# pyright: strict
"""A typed user of every public redmutex API: type-checked by `make lint` (mypy --strict and
pyright in strict mode), never run. Each `assert_type` pins what an editor shows a user."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Literal

import redis
import redmutex
from redmutex import aio
from typing_extensions import assert_type


def clients(r: redis.Redis) -> list[redmutex.ClientLike]:
    one = redmutex.Client("redis://127.0.0.1:6379/0", prefix="app:", connect_timeout=1.0)
    redlock = redmutex.Client(["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    cluster = redmutex.Client(cluster=["redis://a:7000", "redis://b:7000"])
    from_py = redmutex.Client.from_redis(r)
    assert_type(one.ping(), bool)
    assert_type(one.url, str)
    assert_type(one.prefix, str)
    with redmutex.Client() as scoped:
        assert_type(scoped, redmutex.Client)
    cluster.close()
    # every form a `client` argument takes
    return [one, redlock, from_py, "redis://127.0.0.1:6379/0", r]


def sync_primitives(client: redmutex.ClientLike) -> None:
    lock = redmutex.Lock(client, "orders", ttl=5.0, timeout=None, auto_renew=True, fair=True)
    assert_type(lock.acquire(), bool)
    assert_type(lock.acquire(blocking=False, timeout=0.5), bool)
    lock.extend()
    lock.extend(ttl=2.5)
    assert_type(lock.locked(), bool)
    assert_type(lock.owned(), bool)
    assert_type(lock.remaining(), float | None)
    assert_type(lock.token, str | None)
    assert_type(lock.fence, int | None)
    assert_type(lock.lost, bool)
    assert_type(lock.name, str)
    assert_type(lock.ttl, float)
    assert_type(lock.client, redmutex.Client)
    lock.release()
    with redmutex.Lock(client, "x", on_lost=lambda lost: print(lost.name)) as held:
        assert_type(held, redmutex.Lock)

    sem = redmutex.Semaphore(client, "jobs", 3, ttl=10.0, fair=True)
    with sem as s:
        assert_type(s, redmutex.Semaphore)
        assert_type(s.holders(), int)
        assert_type(s.limit, int)
        assert_type(s.fair, bool)

    rw = redmutex.RWLock(client, "doc", ttl=10.0, timeout=1.0)
    with rw.read() as reader:
        assert_type(reader, redmutex.RWLockSide)
        assert_type(reader.mode, Literal["read", "write"])
        assert_type(reader.rwlock, redmutex.RWLock)
    with rw.write():
        assert_type(rw.readers(), int)
        assert_type(rw.locked(), bool)


@redmutex.locked(redmutex.Client(), "lock:{sender}", ttl=10, timeout=10)
def transfer(sender: str, amount: int) -> bool:
    return amount > 0


@redmutex.cached("redis://127.0.0.1:6379/0", ttl=60, key="user:{user_id}")
def load_user(user_id: int) -> dict[str, str]:
    return {"id": str(user_id)}


def cache_and_recipes(client: redmutex.ClientLike, r: redis.Redis) -> None:
    assert_type(transfer("alice", 5), bool)
    assert_type(load_user(1), dict[str, str])
    assert_type(load_user.invalidate(1), bool)
    value = redmutex.get_or_fill(client, "report", lambda: [1, 2, 3], ttl=300)
    assert_type(value, list[int])

    ident = redmutex.acquire_lock(r, "lock:alice", atime=1, ltime=5)
    assert_type(ident, str | Literal[False])
    if ident:
        assert_type(redmutex.release_lock(r, "lock:alice", ident), bool)
    with redmutex.redis_lock(client, "lock:bob") as identifier:
        assert_type(identifier, str)


def errors(client: redmutex.ClientLike) -> str | None:
    try:
        with redmutex.Lock(client, "x", timeout=0):
            pass
    except redmutex.LockTimeoutError as exc:
        assert_type(exc.name, str | None)
        return exc.name
    except redmutex.LockLostError as exc:
        return exc.name
    except redmutex.LockNotOwnedError as exc:
        return exc.name
    except redmutex.QuorumError as exc:
        return exc.name
    except redmutex.SemaphoreLimitError as exc:
        return exc.name
    except redmutex.ConnectionError as exc:
        assert_type(exc, redmutex.ConnectionError)
        return exc.name
    except redmutex.LockError as exc:
        return exc.name
    with contextlib.suppress(redmutex.LockException):
        pass
    return None


async def build() -> dict[str, int]:
    return {"rows": 3}


@aio.locked("redis://127.0.0.1:6379/0", "job:{job_id}", ttl=10)
async def run_job(job_id: int) -> str:
    return str(job_id)


@aio.locked("redis://127.0.0.1:6379/0", "feed:{feed_id}", ttl=10)
async def read_feed(feed_id: int) -> AsyncIterator[bytes]:
    yield str(feed_id).encode()


@aio.cached(redmutex.Client(), ttl=60)
async def fetch(url: str) -> bytes:
    return url.encode()


async def asyncio_api(client: redmutex.ClientLike) -> None:
    lock = aio.Lock(client, "orders", ttl=5.0, timeout=None)
    assert_type(await lock.acquire(), bool)
    assert_type(await lock.acquire(blocking=False, timeout=0.1), bool)
    await lock.extend(ttl=2.0)
    assert_type(await lock.locked(), bool)
    assert_type(await lock.owned(), bool)
    assert_type(lock.remaining(), float | None)
    assert_type(lock.fence, int | None)
    assert_type(lock.token, str | None)
    assert_type(lock.lost, bool)
    assert_type(lock.name, str)
    await lock.release()
    async with aio.Lock(client, "x") as held:
        assert_type(held, aio.Lock)

    async with aio.Semaphore(client, "jobs", 3) as sem:
        assert_type(sem, aio.Semaphore)
        assert_type(await sem.holders(), int)
        assert_type(sem.limit, int)

    rw = aio.RWLock(client, "doc", ttl=10.0)
    async with rw.read() as reader:
        assert_type(reader, aio.RWLockSide)
        assert_type(reader.mode, Literal["read", "write"])
    async with rw.write():
        assert_type(await rw.readers(), int)
        assert_type(await rw.locked(), bool)

    report = await aio.get_or_fill(client, "report", build, ttl=300)
    assert_type(report, dict[str, int])
    plain = await aio.get_or_fill(client, "plain", lambda: 42, ttl=300)
    assert_type(plain, int)
    assert_type(await run_job(7), str)
    async for item in read_feed(7):
        assert_type(item, bytes)
    assert_type(await fetch("http://x"), bytes)
    assert_type(await fetch.invalidate("http://x"), bool)


def decorators_keep_signatures() -> None:
    held: Callable[[str, int], bool] = transfer
    job: Callable[[int], Awaitable[str]] = run_job
    feed: Callable[[int], AsyncIterator[bytes]] = read_feed
    del held, job, feed


def recipe_generator(client: redmutex.ClientLike) -> Iterator[str]:
    with redmutex.redis_lock(client, "gen") as identifier:
        yield identifier
