"""The asyncio loop path: the event loop drives its own connection to a single server for the
one-round-trip steps (first acquire attempt, release, extend, owned), with no runtime thread in
the round trip. Pinned through `_core._aio_calls()` (calls served by the loop path, operations
run on the runtime), and through faults injected by a proxy (tests/_proxy.py): a cancelled
in-flight acquire gives its grant back, a reply that never comes times out, a connection cut
under a call is survived, a flushed script cache is reloaded."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redmutex
from _proxy import FaultProxy
from redmutex import _core, aio
from redmutex._server import RedisServer

if TYPE_CHECKING:
    from conftest import PyProcs


def calls() -> tuple[int, int]:
    """(loop-path calls, runtime operations) so far."""
    loop, runtime = _core._aio_calls()
    return int(loop), int(runtime)


async def warm(lock: Any, limit: float = 10.0) -> None:
    """Acquires and releases until the loop's own connection serves the calls (the first use
    opens it in the background; the runtime serves the calls meanwhile)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = calls()[0]
        assert await lock.acquire()
        await lock.release()
        if calls()[0] >= before + 2:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the loop path never became ready")


async def free_within(other: Any, limit: float = 3.0) -> bool:
    """Whether `other` (on a connection of its own) can take the name within `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await other.acquire(blocking=False):
            await other.release()
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port).start() as p:
        yield p


Make = Callable[[redmutex.Client, str], Any]

PRIMITIVES: dict[str, Make] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=30),
    "lock-fair": lambda c, n: aio.Lock(c, n, ttl=30, fair=True),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=30),
    "rw-read": lambda c, n: aio.RWLock(c, n, ttl=30).read(),
    "rw-write": lambda c, n: aio.RWLock(c, n, ttl=30).write(),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(PRIMITIVES))
def test_uncontended_calls_do_not_use_the_runtime(client: redmutex.Client, kind: str) -> None:
    async def main() -> None:
        hold = PRIMITIVES[kind](client, f"loop-{kind}")
        await warm(hold)
        loop0, runtime0 = calls()
        for _ in range(30):
            assert await hold.acquire()
            assert await hold.owned()
            await hold.extend(20)
            await hold.release()
            assert not await hold.owned()  # not held: answered without a call
        loop1, runtime1 = calls()
        assert runtime1 == runtime0
        assert loop1 - loop0 == 30 * 4

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_the_loop_connection_reads_into_its_own_buffer(client: redmutex.Client) -> None:
    # A BufferedProtocol: the transport reads into one buffer of the connection's (no new bytes
    # object per read, whose 256 KiB glibc maps and unmaps each time).
    async def main() -> None:
        lock = aio.Lock(client, "loop-buffer", ttl=30)
        await warm(lock)
        conns = list(asyncio.get_running_loop()._redmutex_conns.values())  # type: ignore[attr-defined]
        conn = next(c for c in conns if isinstance(c, _core.LoopConn))
        assert isinstance(conn, asyncio.BufferedProtocol)
        buffer = conn.get_buffer(-1)
        assert conn.get_buffer(-1) is buffer
        buffer[:8] = bytes(8)
        loop0, runtime0 = calls()
        assert await lock.acquire()
        await lock.release()  # its reply, an integer, is the last thing read
        assert calls() == (loop0 + 2, runtime0)
        assert bytes(buffer[:1]) == b":"

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_eight_tasks_share_the_loop_connection(client: redmutex.Client) -> None:
    async def main() -> None:
        locks = [aio.Lock(client, f"loop-many-{i}", ttl=30) for i in range(8)]
        await warm(locks[0])
        loop0, runtime0 = calls()

        async def worker(lock: aio.Lock) -> None:
            for _ in range(20):
                async with lock:
                    assert lock.token is not None

        await asyncio.gather(*(worker(lock) for lock in locks))
        assert calls() == (loop0 + 8 * 20 * 2, runtime0)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_busy_lock_is_waited_for_through_the_runtime(client: redmutex.Client) -> None:
    async def main() -> None:
        lock, other = aio.Lock(client, "loop-busy", ttl=30), aio.Lock(client, "loop-busy", ttl=30)
        await warm(lock)
        assert await lock.acquire()
        assert await other.acquire(blocking=False) is False
        runtime0 = calls()[1]
        waiter = asyncio.create_task(other.acquire(timeout=10))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await lock.release()
        assert await waiter is True
        assert calls()[1] > runtime0  # the wait went through the runtime
        await other.release()
        assert await other.acquire(timeout=0.05) is True
        assert await lock.acquire(timeout=0.2) is False
        await other.release()

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_a_cancelled_in_flight_acquire_gives_the_lock_back(
    redis_server: RedisServer, proxy: FaultProxy, prefix: str
) -> None:
    """The acquire's request is out on the loop's connection (slowed by the proxy) when its task
    is cancelled; its reply then grants the lock, which must be given back at once (the lease,
    30 s, would otherwise keep it). Bounded: 25 rounds or 30 s."""

    async def main() -> None:
        slow = redmutex.Client(proxy.url, prefix=prefix)
        direct = redmutex.Client(redis_server.url, prefix=prefix)
        try:
            lock = aio.Lock(slow, "loop-cancel", ttl=30)
            other = aio.Lock(direct, "loop-cancel", ttl=30)
            await warm(lock)
            proxy.set_latency(0.03, "s2c")
            rounds, granted_late = 0, 0
            deadline = time.monotonic() + 30
            while rounds < 25 and time.monotonic() < deadline:
                rounds += 1
                loop0 = calls()[0]
                task = asyncio.create_task(lock.acquire())
                await asyncio.sleep(random.uniform(0.0, 0.04))
                task.cancel()
                try:
                    acquired = await task
                except asyncio.CancelledError:
                    acquired = False
                assert calls()[0] > loop0  # the attempt went out on the loop path
                if acquired:
                    await lock.release()
                else:
                    granted_late += 1
                assert await free_within(other), f"round {rounds}: the lock was kept"
                assert lock.token is None
            assert granted_late > 0
        finally:
            slow.close()
            direct.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_cancelled_in_flight_acquire_leaves_the_object_idle_at_once(
    redis_server: RedisServer, proxy: FaultProxy, prefix: str
) -> None:
    """The cancellation reaches the engine as the task sees it (`_core._loop_cancelled`, from
    `redmutex.aio`), not when the late reply comes: the same object may acquire again at once.
    Without that call the second acquire is refused ("already acquiring")."""

    async def main() -> None:
        slow = redmutex.Client(proxy.url, prefix=prefix)
        try:
            lock = aio.Lock(slow, "loop-cancel-idle", ttl=30)
            await warm(lock)
            proxy.set_latency(0.3, "s2c")
            task = asyncio.create_task(lock.acquire())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await lock.acquire(timeout=10)
            await lock.release()
        finally:
            slow.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_reply_that_never_comes_times_out_and_its_grant_is_given_back(
    redis_server: RedisServer, proxy: FaultProxy, prefix: str
) -> None:
    async def main() -> None:
        slow = redmutex.Client(proxy.url, prefix=prefix, command_timeout=0.3)
        direct = redmutex.Client(redis_server.url, prefix=prefix)
        try:
            lock = aio.Lock(slow, "loop-timeout", ttl=30)
            other = aio.Lock(direct, "loop-timeout", ttl=30)
            await warm(lock)
            # Requests are held (delivered on heal): the attempt may then run after the undo
            # sent when it timed out, and its late reply must bring a second undo.
            proxy.blackhole("c2s", hold=True)
            started = time.monotonic()
            with pytest.raises(redmutex.ConnectionError, match="timed out after 0.3 s"):
                await lock.acquire()
            assert time.monotonic() - started < 3
            assert lock.token is None
            proxy.heal()
            # The late grant (or the undo, whichever came last) leaves the lock free.
            assert await free_within(other, 5)
            # The calls go on (through the runtime, then a new loop connection).
            await warm(lock)
        finally:
            slow.close()
            direct.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", ["acquire", "release"])
def test_a_connection_cut_under_a_call_is_survived(
    redis_server: RedisServer, proxy: FaultProxy, prefix: str, step: str
) -> None:
    """The server ran the call but its reply is lost with the connection: the call is sent
    again through the runtime (as its own calls retry), and the next calls reconnect."""

    async def main() -> None:
        cut = redmutex.Client(proxy.url, prefix=prefix)
        direct = redmutex.Client(redis_server.url, prefix=prefix)
        try:
            name = f"loop-cut-{step}"
            lock = aio.Lock(cut, name, ttl=30)
            other = aio.Lock(direct, name, ttl=30)
            await warm(lock)
            if step == "acquire":
                proxy.drop_reply_to(name.encode())
                assert await lock.acquire() is True
                assert await lock.owned()
                await lock.release()
            else:
                assert await lock.acquire() is True
                proxy.drop_reply_to(name.encode())
                await lock.release()  # released: the first send deleted it
                assert lock.lost is False
            assert proxy.stats.dropped_replies == 1
            assert await free_within(other)
            await warm(lock)
        finally:
            cut.close()
            direct.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_server_restart_is_survived(make_server: Callable[..., RedisServer]) -> None:
    server = make_server()

    async def main() -> None:
        client = redmutex.Client(server.url, prefix="restart:")
        try:
            lock = aio.Lock(client, "loop-restart", ttl=30)
            await warm(lock)
            server.stop()
            with pytest.raises(redmutex.ConnectionError):
                await lock.acquire()
            server.start()
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert await lock.acquire()
                    break
                except redmutex.ConnectionError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            await lock.release()
            await warm(lock)
        finally:
            client.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_flushed_script_cache_is_reloaded(client: redmutex.Client, r: redis.Redis) -> None:
    async def main() -> None:
        lock = aio.Lock(client, "loop-noscript", ttl=30)
        await warm(lock)
        runtime0 = calls()[1]
        for _ in range(3):
            r.script_flush()
            assert await lock.acquire()
            r.script_flush()
            await lock.extend(10)
            r.script_flush()
            await lock.release()
        assert calls()[1] == runtime0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_the_loop_connection_authenticates_and_selects_the_database(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server(extra_args=["--requirepass", "s3cret"])
    url = f"redis://:s3cret@127.0.0.1:{server.port}/3"

    async def main() -> None:
        client = redmutex.Client(url, prefix="auth:")
        try:
            lock = aio.Lock(client, "loop-auth", ttl=30)
            await warm(lock)
            runtime0 = calls()[1]
            assert await lock.acquire()
            r = redis.Redis(port=server.port, password="s3cret", db=3)
            try:
                assert r.exists("auth:{loop-auth}:lock") == 1
            finally:
                r.close()
            await lock.release()
            assert calls()[1] == runtime0
        finally:
            client.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_the_loop_connection_uses_a_unix_socket(
    make_server: Callable[..., RedisServer], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    assert len(path) < 100, "unix socket path too long for this machine's tmp dir"
    make_server(["--unixsocket", path, "--unixsocketperm", "700"])

    async def main() -> None:
        client = redmutex.Client(f"unix://{path}?db=2", prefix="unix:")
        try:
            lock = aio.Lock(client, "loop-unix", ttl=30)
            await warm(lock)
            runtime0 = calls()[1]
            assert await lock.acquire()
            r = redis.Redis(unix_socket_path=path, db=2)
            try:
                assert r.exists("unix:{loop-unix}:lock") == 1
            finally:
                r.close()
            await lock.release()
            assert calls()[1] == runtime0
        finally:
            client.close()

    asyncio.run(main())


# Event loops closed with a bare `loop.close()` (no `asyncio.run`, no `shutdown_asyncgens`) and
# kept referenced, as an application or a test framework may: each one used to keep its
# connection open, and the task opening it was reported destroyed while pending at exit.
BARE_CLOSE = """
import asyncio, json, sys, threading, warnings
import redis, redmutex
from redmutex import aio

warnings.simplefilter("always", ResourceWarning)
url = sys.argv[1]
r = redis.Redis.from_url(url)
client = redmutex.Client(url, prefix=sys.argv[2])

async def use() -> None:
    lock = aio.Lock(client, "bare-close", ttl=30)
    assert await lock.acquire()
    await lock.release()

def count() -> int:
    return len(r.client_list())

asyncio.run(use())  # the client's own (runtime) connection is open from here on
before = count()
loops = []
for _ in range(30):
    loop = asyncio.new_event_loop()
    loop.run_until_complete(use())
    loop.close()
    loops.append(loop)
after = count()

async def close_others() -> None:
    # Closed while this thread runs another loop (which cannot run them meanwhile).
    for _ in range(10):
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_until_complete, args=(use(),))
        runner.start()
        runner.join()
        loop.close()
        loops.append(loop)

asyncio.run(close_others())
after_nested = count()
for _ in range(10):
    asyncio.run(use())
after_run = count()
print(json.dumps({"before": before, "after": after, "after_nested": after_nested,
                  "after_run": after_run}))
r.close()
client.close()
"""


@pytest.mark.timeout(120)
def test_a_bare_loop_close_closes_the_loop_connection(
    redis_url: str, prefix: str, procs: PyProcs
) -> None:
    code, out, err = procs.run(BARE_CLOSE, redis_url, prefix)
    assert code == 0, err
    counts = json.loads(out)
    assert counts["after"] <= counts["before"] + 2, counts
    assert counts["after_nested"] <= counts["before"] + 2, counts
    assert counts["after_run"] <= counts["before"] + 2, counts
    assert "Task was destroyed" not in err, err
    assert "Exception ignored" not in err, err
    assert "unclosed" not in err, err
