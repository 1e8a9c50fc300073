"""A Redis that restarted and is still loading its dataset answers LOADING: nothing ran, and it
serves again shortly. redmutex calls that meet it try again (with a short growing pause) until
`connect_timeout` has passed since the first LOADING, then raise `redmutex.ConnectionError`
(redis-py's BusyLoadingError is one of its ConnectionErrors too) and keep the hold for a retry;
the private server's `start()` returns only once the data is loaded."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.asyncio
import redmutex
import redmutex.aio
from redmutex._core import _aio_calls
from redmutex._server import RedisServer, _answering_pid
from redmutex.compat.redis_py.asyncio import Lock as ShimLock

KEYS = 3000
# Loading then takes at least KEYS * 1 ms = 3 s, answering clients between keys.
SLOW_LOAD = ["--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024"]
# Shorter than the load: the calls that meet it wait this long, then raise.
CONNECT = 0.5


def raw_set(port: int) -> bytes:
    """The reply of one SET, sent on a socket of its own (no client library retries it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"SET loading-probe 1\r\n")
        return sock.recv(200)


def saved_and_stopped(server: RedisServer) -> None:
    """Fills the server so that loading it back is slow, saves it to disk and stops it."""
    r = redis.Redis(port=server.port)
    pipe = r.pipeline(transaction=False)
    for i in range(KEYS):
        pipe.set(f"filler:{i}", "x")
    pipe.execute()
    r.save()
    r.close()
    server.stop()


def restarted_loading(server: RedisServer) -> None:
    """Starts the server again and returns while it still loads (checked: LOADING)."""
    server.start(until_loaded=False)
    assert raw_set(server.port).startswith(b"-LOADING"), "the server had loaded already"


def wait_loaded(server: RedisServer) -> None:
    deadline = time.monotonic() + 60
    while _answering_pid(server.port) is None:
        assert time.monotonic() < deadline, "the server never finished loading"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_start_returns_once_the_dataset_is_loaded(
    make_server: Callable[..., RedisServer],
) -> None:
    """Before, `start()` returned once INFO answered, which it does while loading: the tests'
    first command after a restart could get LOADING (a flaky CI run)."""
    server = make_server(SLOW_LOAD)
    saved_and_stopped(server)
    server.start()
    assert raw_set(server.port) == b"+OK\r\n"


@pytest.mark.timeout(60)
def test_a_lock_meeting_a_loading_server_raises_connection_error_and_keeps_the_hold(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server(SLOW_LOAD)
    client = redmutex.Client(server.url, connect_timeout=CONNECT)
    held = redmutex.Lock(client, "loading-held", ttl=60)
    assert held.acquire()
    saved_and_stopped(server)
    restarted_loading(server)
    with pytest.raises(redmutex.ConnectionError, match="loading"):
        held.release()
    assert held.token is not None  # still ours: a retry releases
    other = redmutex.Lock(client, "loading-other", ttl=60)
    with pytest.raises(redmutex.ConnectionError, match="loading"):
        other.acquire(timeout=0)
    assert other.token is None
    wait_loaded(server)
    held.release()
    assert held.token is None
    assert redis.Redis(port=server.port).exists("redmutex:{loading-held}") == 0
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["aio", "shim"])
def test_asyncio_release_meeting_a_loading_server_keeps_the_hold(
    make_server: Callable[..., RedisServer], kind: str
) -> None:
    """As above, for `redmutex.aio.Lock` and redis-py's asyncio Lock on redmutex's engine (whose
    retry after the restart was the flaky CI run's failure: LockError 'BusyLoading')."""
    server = make_server(SLOW_LOAD)

    async def main() -> None:
        ar = redis.asyncio.Redis(port=server.port, socket_connect_timeout=CONNECT)
        client = redmutex.Client(server.url, connect_timeout=CONNECT)
        try:
            lk: redmutex.aio.Lock | ShimLock
            if kind == "aio":
                lk = redmutex.aio.Lock(client, "loading-aio", ttl=60)
            else:
                lk = ShimLock(ar, "loading-aio", timeout=None)
            assert await lk.acquire()
            saved_and_stopped(server)
            restarted_loading(server)
            with pytest.raises(redmutex.ConnectionError, match="loading"):
                await lk.release()
            await asyncio.to_thread(wait_loaded, server)
            await lk.release()
            assert await ar.exists("redmutex:{loading-aio}", "loading-aio") == 0
        finally:
            await ar.aclose()
            client.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_load_shorter_than_connect_timeout_is_waited_out(
    make_server: Callable[..., RedisServer],
) -> None:
    """The load takes about 3 s; with connect_timeout=10 the release and a new acquire that
    meet it wait until the server serves, then succeed (sync, and asyncio's own connection)."""
    server = make_server(SLOW_LOAD)
    client = redmutex.Client(server.url, connect_timeout=10)
    try:
        held = redmutex.Lock(client, "loading-held", ttl=60)
        assert held.acquire()

        async def aio_take() -> redmutex.aio.Lock:
            lk = redmutex.aio.Lock(client, "loading-aio", ttl=60)
            assert await lk.acquire()
            return lk

        aio_held = asyncio.run(aio_take())
        saved_and_stopped(server)
        restarted_loading(server)
        started = time.monotonic()
        held.release()
        assert held.token is None
        assert redmutex.Lock(client, "loading-other", ttl=60).acquire(timeout=0)

        async def aio_release() -> None:
            await aio_held.release()

        asyncio.run(aio_release())
        assert aio_held.token is None
        assert time.monotonic() - started < 10 + 5
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lease", ["expired", "live"])
@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_release_answered_loading_is_judged_as_sent_once(
    make_server: Callable[..., RedisServer], kind: str, lease: str
) -> None:
    """A release sent on a connection to the restarted server gets LOADING: it did not run, so
    once the load is waited out its answer is judged like any first send's. When the lease
    ended during the load (nobody took the name since) that is a loss, as Redis says. Before,
    `redmutex.aio` sent it again as if its connection had broken under it (the first send might
    have run) and reported it released."""
    server = make_server(SLOW_LOAD)
    r = redis.Redis(port=server.port)
    pipe = r.pipeline(transaction=False)
    for i in range(KEYS):
        pipe.set(f"filler:{i}", "x")
    pipe.execute()
    # The load takes at least 3 s: the lease outlives the release's send, not the load.
    ttl = 2.5 if lease == "expired" else 60.0
    client = redmutex.Client(server.url, connect_timeout=20)

    def restart() -> None:
        r.save()
        r.close()
        server.stop()
        restarted_loading(server)

    try:
        if kind == "sync":
            held = redmutex.Lock(client, "loading-judged", ttl=ttl)
            assert held.acquire()
            restart()
            # Another call meets the restart first (its connection broke): the release goes on
            # a connection to the restarted server.
            opener = threading.Thread(target=redmutex.Lock(client, "loading-opener").locked)
            opener.start()
            time.sleep(0.2)
            remaining = held.remaining()
            assert remaining is not None and remaining > 0.5, "too slow: the lease ended"
            try:
                held.release()
                outcome = "released"
            except redmutex.LockLostError:
                outcome = "lost"
            opener.join()
            lost = held.lost
        else:

            async def main() -> tuple[str, bool]:
                held = redmutex.aio.Lock(client, "loading-judged", ttl=ttl)
                assert await held.acquire()
                restart()
                await asyncio.sleep(0.05)  # the loop hears its connection end
                other = redmutex.aio.Lock(client, "loading-opener")
                # The loop's connection and the runtime's reopen on the restarted server.
                await other.owned()
                opener = asyncio.create_task(other.locked())
                await asyncio.sleep(0.2)
                loop_calls = _aio_calls()[0]
                remaining = held.remaining()

                async def release() -> None:
                    await held.release()

                try:
                    assert remaining is not None and remaining > 0.5, "too slow: the lease ended"
                    outcome = await release_outcome(release)
                finally:
                    await opener
                assert _aio_calls()[0] == loop_calls + 1, "not sent on the loop's connection"
                return outcome, held.lost

            outcome, lost = asyncio.run(main())
        expected = "lost" if lease == "expired" else "released"
        assert outcome == expected
        assert lost == (lease == "expired")
    finally:
        client.close()


async def release_outcome(release: Callable[[], Awaitable[None]]) -> str:
    try:
        await release()
    except redmutex.LockLostError:
        return "lost"
    return "released"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("connect_timeout", [20.0, CONNECT])
def test_a_replicas_acquire_meeting_a_loading_server_waits_it_out(
    make_server: Callable[..., RedisServer], connect_timeout: float
) -> None:
    """With replicas=k the lock write and its WAIT go out as one pipeline on a connection of
    their own. A server still loading answers LOADING to both (neither has Redis's `loading`
    flag), and a LOADING to the write says it did not run: the pipeline is sent again, as the
    other calls are, until `connect_timeout` has passed; then `ConnectionError`. Before, the
    acquire raised at once."""
    primary = make_server(SLOW_LOAD)
    replica = make_server(["--replicaof", "127.0.0.1", str(primary.port)])
    r = redis.Redis(port=primary.port)
    deadline = time.monotonic() + 30
    while r.info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica never came online"
        time.sleep(0.05)
    r.close()
    saved_and_stopped(primary)
    restarted_loading(primary)
    client = redmutex.Client(primary.url, connect_timeout=connect_timeout, command_timeout=10)
    lock = redmutex.Lock(client, "loading-replicas", replicas=1)
    started = time.monotonic()
    try:
        if connect_timeout == CONNECT:
            with pytest.raises(redmutex.ConnectionError, match="loading"):
                lock.acquire(timeout=0)
            took = time.monotonic() - started
            assert CONNECT * 0.9 <= took < CONNECT + 5, took
            assert lock.token is None
        else:
            assert lock.acquire(timeout=0)
            assert time.monotonic() - started < connect_timeout + 10 + 5
            key = "redmutex:{loading-replicas}:lock"
            assert redis.Redis(port=replica.port).get(key) == lock.token.encode()
            lock.release()
    finally:
        client.close()
