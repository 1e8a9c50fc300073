"""A single Redis that restarts (down for a fraction of a second) is waited out: a call started
while it is down tries the refused connect (or the LOADING answer) again, with a short growing
pause, until `connect_timeout` has passed since the first refusal, and succeeds once the server
is back. An outage longer than that still raises `redmutex.ConnectionError` within the client's
timeouts (see also test_faults.py's test_6), and wrong credentials raise at once.

Every server here is started by the test (make_server) and stopped by its PID."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
import redmutex.aio
from _helpers import ResultThread, wait_until
from redmutex._server import RedisServer

CONNECT = 3.0
DOWN = 0.3
# Generous: a loaded CI machine restarts redis-server slowly and schedules threads late.
SLACK = 3.0
PERSIST = ["--appendonly", "yes", "--appendfsync", "always"]

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def server(make_server: Callable[..., RedisServer]) -> RedisServer:
    return make_server(PERSIST)


@pytest.fixture
def client(server: RedisServer, prefix: str) -> Iterator[redmutex.Client]:
    c = redmutex.Client(server.url, prefix=prefix, connect_timeout=CONNECT, command_timeout=3)
    try:
        yield c
    finally:
        c.close()


def outage(server: RedisServer, down: float = DOWN) -> threading.Thread:
    """Stops the server (SIGTERM: with appendonly, its data survives) and starts it again on the
    same port `down` s later, in a thread; returns once the server is down."""
    server.stop()
    restarter = threading.Thread(target=lambda: (time.sleep(down), server.start()), daemon=True)
    restarter.start()
    return restarter


def during_outage(server: RedisServer, call: Callable[[], object]) -> tuple[object, float]:
    """Runs `call` while the server is down (it comes back DOWN s later): its result and how
    long it took."""
    restarter = outage(server)
    try:
        started = time.monotonic()
        result = call()
        return result, time.monotonic() - started
    finally:
        restarter.join(30)
        assert not restarter.is_alive(), "the server did not come back"


def run_async(coro_fn: Callable[[], object]) -> object:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- (a)


def test_lock_calls_started_while_down_succeed_once_it_is_back(
    server: RedisServer, client: redmutex.Client, prefix: str
) -> None:
    held = [redmutex.Lock(client, f"held{i}", ttl=60) for i in range(4)]
    for lock in held:
        assert lock.acquire(timeout=5)
    calls: list[tuple[str, Callable[[], object], object]] = [
        ("acquire(timeout=0)", lambda: redmutex.Lock(client, "a", ttl=60).acquire(timeout=0), True),
        ("acquire(timeout=5)", lambda: redmutex.Lock(client, "b", ttl=60).acquire(timeout=5), True),
        ("release", held[0].release, None),
        ("extend", held[1].extend, None),
        ("owned", held[2].owned, True),
        ("locked", held[3].locked, True),
        ("ping", client.ping, True),
    ]
    for what, call, expected in calls:
        result, took = during_outage(server, call)
        assert result == expected, what
        assert took < CONNECT + SLACK, f"{what} took {took:.2f} s"
    with redis.Redis(port=server.port) as r:
        assert r.exists(prefix + "{held0}:lock") == 0  # released
        assert r.get(prefix + "{held1}:lock") == (held[1].token or "").encode()  # kept
    assert held[0].token is None
    assert held[2].owned() and held[1].owned()


def test_classic_semaphore_and_cache_calls_started_while_down_succeed(
    server: RedisServer, client: redmutex.Client
) -> None:
    ident = redmutex.acquire_lock(client, "classic-held", atime=5, ltime=60)
    assert ident
    calls: list[tuple[str, Callable[[], object], object]] = [
        (
            "acquire_lock(atime=5)",
            lambda: bool(redmutex.acquire_lock(client, "classic-a", atime=5, ltime=60)),
            True,
        ),
        ("release_lock", lambda: redmutex.release_lock(client, "classic-held", ident), True),
        (
            "Semaphore.acquire(timeout=5)",
            lambda: redmutex.Semaphore(client, "sem", 2, ttl=60).acquire(timeout=5),
            True,
        ),
        (
            "get_or_fill(timeout=5)",
            lambda: redmutex.get_or_fill(client, "gof", lambda: 42, ttl=60, timeout=5),
            42,
        ),
    ]
    for what, call, expected in calls:
        result, took = during_outage(server, call)
        assert result == expected, what
        assert took < CONNECT + SLACK, f"{what} took {took:.2f} s"


def test_aio_lock_calls_started_while_down_succeed(
    server: RedisServer, client: redmutex.Client
) -> None:
    held = redmutex.aio.Lock(client, "aio-held", ttl=60)

    async def take_held() -> bool:
        return await held.acquire(timeout=5)

    async def acquire_and_release() -> bool:
        lock = redmutex.aio.Lock(client, "aio-a", ttl=60)
        got = await lock.acquire(timeout=5)
        await lock.release()
        return got

    async def release_held() -> bool:
        await held.release()
        return held.token is None

    assert run_async(take_held)
    for what, coro in [("acquire/release", acquire_and_release), ("release", release_held)]:
        result, took = during_outage(server, lambda c=coro: run_async(c))  # type: ignore[misc]
        assert result is True, what
        assert took < CONNECT + SLACK, f"aio {what} took {took:.2f} s"


def test_unix_socket_missing_while_down_is_waited_out(
    make_server: Callable[..., RedisServer], prefix: str
) -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="redmutex-sock-"), "redis.sock")
    server = make_server([*PERSIST, "--unixsocket", path, "--unixsocketperm", "700"])
    c = redmutex.Client(f"unix://{path}", prefix=prefix, connect_timeout=CONNECT)
    try:
        held = redmutex.Lock(c, "u-held", ttl=60)
        assert held.acquire(timeout=5)

        def release_with_the_file_gone() -> None:
            # redis-server removes its socket file as it stops: the connect meets ENOENT.
            assert not os.path.exists(path)
            held.release()

        result, took = during_outage(server, release_with_the_file_gone)
        assert result is None and held.token is None
        assert took < CONNECT + SLACK
        result, took = during_outage(
            server, lambda: redmutex.Lock(c, "u-a", ttl=60).acquire(timeout=0)
        )
        assert result is True and took < CONNECT + SLACK
    finally:
        c.close()


# ------------------------------------------------------------------------------------- (b)


def _subscribers(port: int, channel: str) -> int:
    with redis.Redis(port=port) as r:
        return int(dict(r.pubsub_numsub(channel)).get(channel.encode(), 0))


def _waiting_behind(
    server: RedisServer, c: redmutex.Client, prefix: str, name: str
) -> tuple[redmutex.Lock, ResultThread]:
    """A hold of `name`, and a thread waiting for it without a timeout, subscribed."""
    holder = redmutex.Lock(c, name, ttl=60)
    assert holder.acquire(timeout=5)
    waiter = ResultThread(lambda: redmutex.Lock(c, name, ttl=60).acquire(timeout=None))
    waiter.start()
    channel = prefix + "{" + name + "}:wake"
    wait_until(lambda: _subscribers(server.port, channel) >= 1, 10, "the waiter to subscribe")
    return holder, waiter


def test_waiter_across_a_restart_is_woken_by_a_release_after_it(
    server: RedisServer, client: redmutex.Client, prefix: str
) -> None:
    holder, waiter = _waiting_behind(server, client, prefix, "w")
    channel = prefix + "{w}:wake"
    outage(server).join(30)
    # Back, with the hold (appendonly): the waiter waits on, listening again.
    wait_until(lambda: _subscribers(server.port, channel) >= 1, 10, "the waiter to listen again")
    assert waiter.is_alive(), f"the waiter ended: {waiter.error!r} {waiter.result!r}"
    released_at = time.monotonic()
    holder.release()
    assert waiter.outcome(10) is True
    assert waiter.finished_at is not None and waiter.finished_at - released_at < SLACK


def test_waiter_takes_the_lock_when_a_restart_lost_the_hold(
    make_server: Callable[..., RedisServer], prefix: str
) -> None:
    server = make_server()  # no persistence: the restart forgets the hold
    c = redmutex.Client(server.url, prefix=prefix, connect_timeout=CONNECT)
    try:
        _, waiter = _waiting_behind(server, c, prefix, "v")
        back = outage(server)
        back.join(30)
        assert waiter.outcome(CONNECT + SLACK) is True
    finally:
        c.close()


# ------------------------------------------------------------------------------------- (c)


def test_an_outage_longer_than_connect_timeout_still_raises_in_time(
    make_server: Callable[..., RedisServer], prefix: str
) -> None:
    server = make_server()
    connect, command = 0.5, 1.0
    bound = connect + command + SLACK
    c = redmutex.Client(server.url, prefix=prefix, connect_timeout=connect, command_timeout=command)
    try:
        held, waiter = _waiting_behind(server, c, prefix, "held")
        server.stop()  # and stays down
        down_at = time.monotonic()
        waiter.join(bound + 5)
        assert isinstance(waiter.error, redmutex.ConnectionError), waiter.error
        assert waiter.finished_at is not None and waiter.finished_at - down_at < bound
        calls: list[Callable[[], object]] = [
            c.ping,
            held.release,
            held.extend,
            lambda: redmutex.Lock(c, "new", ttl=60).acquire(timeout=0),
            lambda: redmutex.Lock(c, "new", ttl=60).acquire(timeout=5),
            lambda: run_async(lambda: redmutex.aio.Lock(c, "anew", ttl=60).acquire(timeout=5)),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError):
                call()
            took = time.monotonic() - started
            assert took < bound, f"raised after {took:.2f} s"
        assert held.token is not None  # kept for a retry
    finally:
        c.close()


# ------------------------------------------------------------------------------------- (d)


def test_wrong_password_raises_at_once(make_server: Callable[..., RedisServer]) -> None:
    server = make_server(["--requirepass", "s3cret-right"])
    c = redmutex.Client(
        f"redis://:wrong@127.0.0.1:{server.port}/0", connect_timeout=CONNECT, command_timeout=3
    )
    try:
        for call in [c.ping, lambda: redmutex.Lock(c, "x", ttl=5).acquire(timeout=0)]:
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError, match="(?i)credentials|authentication"):
                call()
            assert time.monotonic() - started < CONNECT / 2
    finally:
        c.close()
