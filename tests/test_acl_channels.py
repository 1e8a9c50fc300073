"""A user whose ACL gives it every key and command but no pub/sub channel (`~* +@all`, Redis 7's
usual user without `&*`): every call that would publish a wake-up raises a LockError saying
what to grant, and leaves Redis as it was (a Redis script's error keeps the writes before it, so
the scripts publish before they write). A user with `&*` runs the same flows as the control.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from redmutex import LockError
from redmutex._core import _script_source
from redmutex._server import RedisServer

# What the error says when the ACL refused a channel (and Redis's own words follow it).
REFUSED = "may not use redmutex's pub/sub channels"
TTL = 30.0
KeyOf = Callable[[str, str], bytes]


@pytest.fixture(scope="module")
def users(redis_server: RedisServer) -> Iterator[dict[bool, str]]:
    """{has channels: URL}: two users with every key and command, one without any channel."""
    admin = redis.Redis.from_url(redis_server.url)
    suffix = uuid.uuid4().hex[:8]
    names = {False: f"nochan-{suffix}", True: f"chan-{suffix}"}
    # (resetchannels said outright: whatever acl-pubsub-default the server has)
    admin.execute_command(
        "ACL", "SETUSER", names[False], "on", ">pw", "~*", "resetchannels", "+@all"
    )
    admin.execute_command("ACL", "SETUSER", names[True], "on", ">pw", "~*", "&*", "+@all")
    try:
        yield {
            has: redis_server.url.replace("redis://", f"redis://{name}:pw@", 1)
            for has, name in names.items()
        }
    finally:
        for name in names.values():
            admin.execute_command("ACL", "DELUSER", name)
        admin.close()


@pytest.fixture(params=[False, True], ids=["no-channels", "channels"])
def channels(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def user(users: dict[bool, str], channels: bool, prefix: str) -> Iterator[redmutex.Client]:
    """A client of the user under test (with or without channels)."""
    c = redmutex.Client(users[channels], prefix=prefix)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def other(users: dict[bool, str], prefix: str) -> Iterator[redmutex.Client]:
    """A client of the user with channels: a waiter that can wait."""
    c = redmutex.Client(users[True], prefix=prefix)
    try:
        yield c
    finally:
        c.close()


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def still_held(r: redis.Redis, key: bytes, token: str | None) -> None:
    """The lock key holds `token` with most of its lease left: nothing was released or cut."""
    assert token is not None
    assert r.get(key) == token.encode()
    assert r.pttl(key) > (TTL - 10) * 1000


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_lock_release(
    user: redmutex.Client, channels: bool, fair: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    lock = redmutex.Lock(user, "l", ttl=TTL, fair=fair)
    assert lock.acquire(timeout=0)
    token = lock.token
    if channels:
        lock.release()
        assert r.exists(key_of("l", "lock")) == 0
        return
    with pytest.raises(LockError, match=REFUSED):
        lock.release()
    still_held(r, key_of("l", "lock"), token)
    assert lock.owned()


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_lock_release_with_a_waiter_queued(
    user: redmutex.Client,
    other: redmutex.Client,
    channels: bool,
    fair: bool,
    r: redis.Redis,
    key_of: KeyOf,
) -> None:
    """A waiter (of a user with channels) waits: the release grants it the lock (fair) or wakes
    it; refused, the holder keeps the lock and the waiter its place."""
    holder = redmutex.Lock(user, "q", ttl=TTL, fair=fair)
    assert holder.acquire(timeout=0)
    token = holder.token
    waiter = redmutex.Lock(other, "q", ttl=TTL, fair=fair)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    try:
        queue, fence = key_of("q", "lock:queue"), key_of("q", "fence")
        wake = key_of("q", "wake")
        if fair:
            wait_until(lambda: r.exists(queue))
        else:
            wait_until(lambda: r.exists(queue) or r.pubsub_numsub(wake)[0][1] > 0)
        places, counter = r.hgetall(queue), r.get(fence)
        if channels:
            holder.release()
            thread.join(15)
            assert got == [True]
            waiter.release()
            return
        with pytest.raises(LockError, match=REFUSED):
            holder.release()
        still_held(r, key_of("q", "lock"), token)
        assert holder.owned()
        assert r.hgetall(queue) == places
        assert r.get(fence) == counter
        assert got == []
        # Let the waiter in (as the release would have) so that the test ends.
        r.delete(key_of("q", "lock"))
        r.publish(wake, "")
        thread.join(15)
        assert got == [True]
        waiter.release()
    finally:
        thread.join(25)


def test_release_lock_recipe(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    identifier = redmutex.acquire_lock(user, "c", ltime=TTL)
    assert identifier
    if channels:
        assert redmutex.release_lock(user, "c", identifier) is True
        assert r.exists(key_of("c", "lock")) == 0
        return
    with pytest.raises(LockError, match=REFUSED):
        redmutex.release_lock(user, "c", identifier)
    still_held(r, key_of("c", "lock"), identifier)


def test_redis_lock_recipe(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    held: list[str] = []
    if channels:
        with redmutex.redis_lock(user, "rl", ltime=TTL) as identifier:
            held.append(identifier)
        assert r.exists(key_of("rl", "lock")) == 0
        return
    with (
        pytest.raises(LockError, match=REFUSED),
        redmutex.redis_lock(user, "rl", ltime=TTL) as identifier,
    ):
        held.append(identifier)
    still_held(r, key_of("rl", "lock"), held[0])


def test_semaphore_release(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    sem = redmutex.Semaphore(user, "s", 2, ttl=TTL)
    assert sem.acquire(timeout=0)
    token = sem.token
    assert token is not None
    holders = key_of("s", "sem:holders")
    if channels:
        sem.release()
        assert r.exists(holders) == 0
        return
    with pytest.raises(LockError, match=REFUSED):
        sem.release()
    assert r.zscore(holders, token) is not None
    assert sem.holders() == 1


def test_rwlock_write_release(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    write = redmutex.RWLock(user, "rw", ttl=TTL).write()
    assert write.acquire(timeout=0)
    token = write.token
    if channels:
        write.release()
        assert r.exists(key_of("rw", "rw:writer")) == 0
        return
    with pytest.raises(LockError, match=REFUSED):
        write.release()
    still_held(r, key_of("rw", "rw:writer"), token)
    assert write.owned()


def test_rwlock_read_release_wakes_a_waiting_writer(
    user: redmutex.Client,
    other: redmutex.Client,
    channels: bool,
    r: redis.Redis,
    key_of: KeyOf,
) -> None:
    """The last reader's release wakes the waiting writers (a release without one publishes
    nothing)."""
    read = redmutex.RWLock(user, "rr", ttl=TTL).read()
    assert read.acquire(timeout=0)
    token = read.token
    assert token is not None
    writer = redmutex.RWLock(other, "rr", ttl=TTL).write()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(writer.acquire(timeout=20)))
    thread.start()
    try:
        readers, waiting = key_of("rr", "rw:readers"), key_of("rr", "rw:writers_waiting")
        wait_until(lambda: r.exists(waiting))
        if channels:
            read.release()
            thread.join(15)
            assert got == [True]
            writer.release()
            return
        with pytest.raises(LockError, match=REFUSED):
            read.release()
        assert r.zscore(readers, token) is not None
        assert read.owned()
        assert got == []
        r.delete(readers)
        r.publish(key_of("rr", "wake"), "")
        thread.join(15)
        assert got == [True]
        writer.release()
    finally:
        thread.join(25)


def test_multilock_release(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    multi = redmutex.MultiLock(user, ["m1", "m2"], ttl=TTL)
    assert multi.acquire(timeout=0)
    tokens = [r.get(key_of(name, "lock")) for name in ("m1", "m2")]
    assert tokens[0] is not None and tokens[0] == tokens[1]
    if channels:
        multi.release()
        assert r.exists(key_of("m1", "lock"), key_of("m2", "lock")) == 0
        return
    with pytest.raises(LockError, match=REFUSED):
        multi.release()
    for name in ("m1", "m2"):
        still_held(r, key_of(name, "lock"), tokens[0].decode())
    assert multi.owned()


def test_get_or_fill_store(
    user: redmutex.Client,
    channels: bool,
    r: redis.Redis,
    key_of: KeyOf,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The filler gets its value either way; refused, the value is not stored (nor said to be)."""
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        assert redmutex.get_or_fill(user, "k", lambda: "v", ttl=TTL) == "v"
    if channels:
        assert r.exists(key_of("k", "value")) == 1
        return
    assert r.exists(key_of("k", "value")) == 0
    assert REFUSED in caplog.text, caplog.text


def test_extend_shortening_a_lease(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    """A lease cut short publishes (the waiters sleep until the end they last read)."""
    lock = redmutex.Lock(user, "e", ttl=TTL)
    assert lock.acquire(timeout=0)
    token = lock.token
    if channels:
        lock.extend(5)
        assert 0 < r.pttl(key_of("e", "lock")) <= 5000
        lock.release()
        return
    with pytest.raises(LockError, match=REFUSED):
        lock.extend(5)
    still_held(r, key_of("e", "lock"), token)
    assert lock.owned()


def test_reentrant_release(
    user: redmutex.Client, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    lock = redmutex.Lock(user, "re", ttl=TTL, reentrant=True)
    assert lock.acquire(timeout=0)
    assert lock.acquire(timeout=0)
    token = lock.token
    lock.release()  # the inner release only counts down: nothing to publish
    if channels:
        lock.release()
        assert r.exists(key_of("re", "lock"), key_of("re", "lock:holds")) == 0
        return
    holds = r.get(key_of("re", "lock:holds"))
    with pytest.raises(LockError, match=REFUSED):
        lock.release()
    still_held(r, key_of("re", "lock"), token)
    assert r.get(key_of("re", "lock:holds")) == holds
    assert lock.owned()


@pytest.fixture
def as_user(users: dict[bool, str], channels: bool) -> Iterator[redis.Redis]:
    """A redis-py connection of the user under test: runs a script as the core sends it."""
    conn = redis.Redis.from_url(users[channels])
    try:
        yield conn
    finally:
        conn.close()


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_fair_take_at_the_head_gives_the_lock_back_when_refused(
    as_user: redis.Redis, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    """A fair waiter at the head of the queue takes a free lock (a lease ran out unreleased)
    and tells the waiters behind; its first look took the lock already (SET NX GET): refused the
    PUBLISH, it gives it back, keeps its place, and the reply is the refusal."""
    lock, fence, queue, wake = (key_of("h", s) for s in ("lock", "fence", "lock:queue", "wake"))
    now = server_ms(r)
    r.hset(queue, "head", f"{now * 1000} {now + 60_000} 10000 ")
    r.hset(queue, "behind", f"{now * 1000 + 1} {now + 60_000} 10000 ")
    join = as_user.register_script(_script_source("lock_acquire_fair"))
    args: list[str | int] = ["head", 10_000, 6000, "1", "", 5000, wake.decode()]
    if channels:
        assert isinstance(join(keys=[lock, fence, queue], args=args), int)
        assert r.get(lock) == b"head" and r.hkeys(queue) == [b"behind"]
        return
    places = r.hgetall(queue)
    with pytest.raises(redis.ResponseError, match="channel"):
        join(keys=[lock, fence, queue], args=args)
    assert r.exists(lock, fence) == 0
    assert r.hgetall(queue) == places


def test_write_take_from_a_waiting_place_gives_the_lock_back_when_refused(
    as_user: redis.Redis, channels: bool, r: redis.Redis, key_of: KeyOf
) -> None:
    """A waiting writer that takes the write lock tells the readers its place held back (see
    rw_write_acquire.lua): refused, the write lock goes back and the place stays."""
    readers, writer, waiting, wake = (
        key_of("w", s) for s in ("rw:readers", "rw:writer", "rw:writers_waiting", "wake")
    )
    r.zadd(waiting, {"w": server_ms(r) + 60_000})
    acquire = as_user.register_script(_script_source("rw_write_acquire"))
    args: list[str | int] = ["w", 10_000, 6000, "1", wake.decode()]
    if channels:
        assert acquire(keys=[readers, writer, waiting], args=args) == 0
        assert r.get(writer) == b"w" and r.exists(waiting) == 0
        return
    place = r.zscore(waiting, "w")
    with pytest.raises(redis.ResponseError, match="channel"):
        acquire(keys=[readers, writer, waiting], args=args)
    assert r.exists(writer) == 0
    assert r.zscore(waiting, "w") == place
