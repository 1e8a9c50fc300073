"""Issue 20, item 1: `Lock(..., reentrant=True)` and `aio.Lock(..., reentrant=True)`.

The owner is the thread (asyncio: the task). It may acquire again while it holds; each acquire
needs its release and the lock is free after the last. Another thread or task of the same object
is another owner and waits (woken by the release, never polled). The hold count lives in Redis
beside the hold (`prefix{name}:lock:holds`, '<token> <count>' while the count is 2 or more), so
renewal, loss, fences (one per outermost hold), `fair=True` and `replicas=k` work unchanged, and
the command line shows the count.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
import redmutex.aio
from _proxy import FaultProxy
from redmutex._server import RedisServer


def holds_key(prefix: str, name: str) -> bytes:
    return (prefix + "{" + name + "}:lock:holds").encode()


def lock_key(prefix: str, name: str) -> bytes:
    return (prefix + "{" + name + "}:lock").encode()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redmutex", *args],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


# ------------------------------------------------------------------------- depth and order


def test_depth_and_release_order(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    lock = redmutex.Lock(client, "depth", ttl=10, reentrant=True)
    other = redmutex.Lock(client, "depth", ttl=10)
    assert lock.reentrant and not other.reentrant
    assert lock.acquire()
    assert r.get(holds_key(prefix, "depth")) is None  # a single hold writes no count
    token, fence = lock.token, lock.fence
    assert lock.acquire(blocking=False)  # re-entry never waits
    assert lock.acquire(timeout=0)
    assert lock._depth == 3
    assert r.get(holds_key(prefix, "depth")) == f"{token} 3".encode()
    assert lock.token == token and lock.fence == fence  # one hold, one fence
    lock.release()
    assert lock._depth == 2 and lock.owned() and lock.locked()
    assert r.get(holds_key(prefix, "depth")) == f"{token} 2".encode()
    assert not other.acquire(blocking=False)
    lock.release()
    assert r.get(holds_key(prefix, "depth")) is None
    assert not other.acquire(blocking=False)  # still held: the outermost acquire is left
    assert lock.owned() and lock.token == token
    lock.release()
    assert lock.token is None and lock.fence is None and not lock.owned()
    assert lock._depth == 0
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.release()  # one release too many
    assert other.acquire(blocking=False)  # free after the last release
    other.release()
    # Nothing of the lock is left but the fence counter.
    left = set(r.scan_iter(match=(prefix + "{depth}*").encode()))
    assert left == {(prefix + "{depth}:fence").encode()}


def test_nested_with_blocks_and_one_fence_per_outermost_hold(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "nested", ttl=10, reentrant=True)
    fences = []
    for _ in range(3):
        with lock:
            outer = lock.fence
            with lock:
                assert lock.fence == outer
                with lock:
                    assert lock.fence == outer and lock._depth == 3
                assert lock._depth == 2
            assert lock.owned()
            fences.append(outer)
        assert lock.token is None
    assert fences == sorted(set(fences)), fences  # a new, larger fence per outermost hold


def test_default_stays_non_reentrant(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "plain", ttl=5)
    assert not lock.reentrant
    with lock:
        with pytest.raises(redmutex.LockError, match="not re-entrant"):
            lock.acquire()
        assert lock._depth == 1


def test_another_lock_object_of_the_name_in_the_same_thread_re_enters(
    client: redmutex.Client, prefix: str, r: redis.Redis
) -> None:
    # The owner is the thread, and a lock is its name (not the object, unlike threading.RLock):
    # a function that makes its own Lock on each call may call itself, or another function doing
    # the same, while it holds, and re-enters instead of waiting for itself forever.
    def nested(depth: int, tokens: list[str | None]) -> None:
        lock = redmutex.Lock(client, "two-objects", ttl=5, reentrant=True)
        with lock:
            tokens.append(lock.token)
            assert lock._depth == len(tokens)
            if depth > 1:
                nested(depth - 1, tokens)
            assert lock.owned()

    tokens: list[str | None] = []
    worker = threading.Thread(target=nested, args=(3, tokens), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "a second Lock object of the name waited for its own thread"
    assert len(tokens) == 3 and tokens[0] is not None and len(set(tokens)) == 1  # one hold
    assert not r.exists(lock_key(prefix, "two-objects"))  # free after the outermost release

    first = redmutex.Lock(client, "two-objects", ttl=5, reentrant=True)
    second = redmutex.Lock(client, "two-objects", ttl=5, reentrant=True)
    plain = redmutex.Lock(client, "two-objects", ttl=5)
    with first:
        assert second.acquire(timeout=0)  # re-entry, through the other object
        assert second.token == first.token and second.fence == first.fence
        assert second._depth == first._depth == 2
        assert not plain.acquire(blocking=False)  # a non-re-entrant object is another owner
        first.release()  # either object releases the thread's hold, one level each
        assert second.owned() and first.owned()
    assert first.token is None and second.token is None and not second.owned()
    with pytest.raises(redmutex.LockNotOwnedError):
        second.release()
    # Another thread is another owner, whichever object it uses.
    with first:
        other: list[bool] = []
        t = threading.Thread(target=lambda: other.append(second.acquire(timeout=0.2)))
        t.start()
        t.join(10)
        assert other == [False]


# ------------------------------------------------------------------- other threads and tasks


def test_other_threads_are_excluded_and_woken_by_the_last_release(
    client: redmutex.Client,
) -> None:
    lock = redmutex.Lock(client, "threads", ttl=30, reentrant=True)
    assert lock.acquire() and lock.acquire()
    got = threading.Event()
    acquired_at: list[float] = []
    errors: list[BaseException] = []

    def other() -> None:
        try:
            # Another thread of the same object: not the owner, so it neither re-enters nor
            # may release the owner's hold.
            assert lock.token is not None  # it sees the hold another thread has
            with pytest.raises(redmutex.LockNotOwnedError):
                lock.release()
            assert not lock.owned()
            assert lock.acquire(timeout=20)
            acquired_at.append(time.monotonic())
            got.set()
            assert lock._depth == 1
            lock.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            got.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert not got.wait(0.4)  # waiting while the owner holds twice
    lock.release()
    assert not got.wait(0.4)  # and once
    released_at = time.monotonic()
    lock.release()
    assert got.wait(10)
    thread.join(10)
    assert not errors, errors
    # Woken by the release, not by the 30 s lease ending nor a poll.
    assert acquired_at[0] - released_at < 2.0


def test_other_tasks_are_excluded(client: redmutex.Client, prefix: str) -> None:
    async def main() -> None:
        lock = redmutex.aio.Lock(client, "tasks", ttl=30, reentrant=True)
        order: list[str] = []
        a_holds = asyncio.Event()
        step = asyncio.Event()

        async def a() -> None:
            async with lock:
                fence = lock.fence
                async with lock:
                    assert lock.fence == fence and lock._core._depth == 2
                    order.append("a in")
                    a_holds.set()
                    await step.wait()
                    await asyncio.sleep(0.3)
                    order.append("a inner out")
                await asyncio.sleep(0.3)
                assert await lock.owned()
                order.append("a out")

        async def b() -> None:
            await a_holds.wait()
            assert not await lock.owned()  # the task that holds is another owner
            with pytest.raises(redmutex.LockNotOwnedError):
                await lock.release()
            step.set()
            async with lock:
                order.append("b in")
                assert lock._core._depth == 1
            order.append("b out")

        await asyncio.wait_for(asyncio.gather(a(), b()), 20)
        assert order == ["a in", "a inner out", "a out", "b in", "b out"]
        # A task re-enters its own hold, with the same token and fence.
        assert await lock.acquire()
        token, fence = lock.token, lock.fence
        assert await lock.acquire(blocking=False)
        assert lock.token == token and lock.fence == fence
        await lock.release()
        assert lock.token == token
        await lock.release()
        assert lock.token is None
        with pytest.raises(redmutex.LockNotOwnedError):
            await lock.release()

    asyncio.run(main())


def test_another_aio_lock_object_of_the_name_in_the_same_task_re_enters(
    client: redmutex.Client,
) -> None:
    async def nested(depth: int, tokens: list[str | None]) -> None:
        lock = redmutex.aio.Lock(client, "aio-two-objects", ttl=5, reentrant=True)
        async with lock:
            tokens.append(lock.token)
            if depth > 1:
                await nested(depth - 1, tokens)
            assert await lock.owned()

    async def main() -> None:
        tokens: list[str | None] = []
        await asyncio.wait_for(nested(3, tokens), 10)  # never waits for its own task
        assert len(tokens) == 3 and tokens[0] is not None and len(set(tokens)) == 1
        first = redmutex.aio.Lock(client, "aio-two-objects", ttl=5, reentrant=True)
        second = redmutex.aio.Lock(client, "aio-two-objects", ttl=5, reentrant=True)
        async with first:
            assert await second.acquire(timeout=0)
            assert second.token == first.token and second.fence == first.fence

            async def other_task() -> bool:
                return await second.acquire(timeout=0.2)

            assert await asyncio.create_task(other_task()) is False  # another task: another owner
            await second.release()
            assert await first.owned()
        assert first.token is None and second.token is None
        assert not await first.locked()

    asyncio.run(main())


def test_aio_default_stays_non_reentrant(client: redmutex.Client) -> None:
    async def main() -> None:
        lock = redmutex.aio.Lock(client, "aio-plain", ttl=5)
        async with lock:
            with pytest.raises(redmutex.LockError):
                await lock.acquire()

    asyncio.run(main())


# ---------------------------------------------------------------------- renewal and loss


def test_renewal_keeps_a_nested_hold_alive(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    lock = redmutex.Lock(client, "renewed", ttl=1.5, auto_renew=True, reentrant=True)
    with lock, lock, lock:
        time.sleep(4.6)  # more than three leases
        assert lock.owned() and not lock.lost
        assert r.get(holds_key(prefix, "renewed")) == f"{lock.token} 3".encode()
        assert 0 < r.pttl(holds_key(prefix, "renewed")) <= 1500
        lock.extend(5)  # one lease for the whole hold, the count's with it
        assert r.pttl(holds_key(prefix, "renewed")) > 4000
        assert r.pttl(lock_key(prefix, "renewed")) > 4000
        assert (lock.remaining() or 0) > 4
    assert lock.token is None and not lock.lost


def test_a_reentry_lengthens_a_short_lease_to_the_ttl(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    lock = redmutex.Lock(client, "lengthen", ttl=5, reentrant=True)
    with lock:
        lock.extend(0.5)
        with lock:
            assert r.pttl(lock_key(prefix, "lengthen")) > 4000
            assert (lock.remaining() or 0) > 4
            lock.extend(20)
            with lock:  # never shortened
                assert r.pttl(lock_key(prefix, "lengthen")) > 15000


def test_loss_is_reported_once_for_the_whole_hold(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls: list[redmutex.Lock] = []
    lock = redmutex.Lock(
        client, "lost", ttl=0.6, auto_renew=True, reentrant=True, on_lost=calls.append
    )
    assert lock.acquire() and lock.acquire() and lock.acquire()
    r.delete(lock_key(prefix, "lost"))
    wait_until(lambda: bool(calls))
    assert lock.lost
    with pytest.raises(redmutex.LockLostError):
        lock.acquire()  # a lost hold is not re-entered
    with pytest.raises(redmutex.LockLostError):
        lock.extend()
    # Every level that was held when the loss came says so on its release.
    for _ in range(3):
        with pytest.raises(redmutex.LockLostError):
            lock.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        lock.release()
    time.sleep(0.5)
    assert calls == [lock]  # one on_lost for the whole hold
    assert lock.lost
    assert lock.acquire()  # a new hold
    assert not lock.lost
    lock.release()


def test_loss_seen_by_a_nested_release(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    lock = redmutex.Lock(client, "lost-nested", ttl=10, reentrant=True)
    with pytest.raises(redmutex.LockLostError), lock, lock:
        # Another process force-releases the lock and somebody else takes it.
        r.delete(lock_key(prefix, "lost-nested"))
        other = redmutex.Lock(client, "lost-nested", ttl=10)
        assert other.acquire(blocking=False)
    # The inner block's release saw the loss (LockLostError), the outer one's logged it.
    assert lock.lost and lock.token is None
    assert other.owned()
    other.release()


def test_aio_loss_reported_once(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    async def main() -> None:
        calls: list[object] = []
        lock = redmutex.aio.Lock(
            client, "aio-lost", ttl=0.6, auto_renew=True, reentrant=True, on_lost=calls.append
        )
        assert await lock.acquire() and await lock.acquire()
        r.delete(lock_key(prefix, "aio-lost"))
        deadline = time.monotonic() + 10
        while not calls:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert lock.lost
        for _ in range(2):
            with pytest.raises(redmutex.LockLostError):
                await lock.release()
        with pytest.raises(redmutex.LockNotOwnedError):
            await lock.release()
        await asyncio.sleep(0.4)
        assert calls == [lock]

    asyncio.run(main())


# ---------------------------------------------------------------------- fair and replicas


def test_fair_reentrant_lock_grants_after_the_last_release(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "fair", ttl=30, fair=True, reentrant=True)
    waiter = redmutex.Lock(client, "fair", ttl=30, fair=True)
    with lock:
        fence = lock.fence
        with lock:
            assert lock.fence == fence
            got = threading.Event()

            def wait() -> None:
                if waiter.acquire(timeout=20):
                    got.set()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.3)
        assert not got.wait(0.3)  # the inner release hands nothing on
        assert lock.owned()
    assert got.wait(5)
    thread.join(5)
    assert (waiter.fence or 0) > (fence or 0)
    waiter.release()


@pytest.fixture
def replicated(make_server: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    """A primary with one online replica, both ours."""
    primary = make_server()
    make_server(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    conn = redis.Redis(host="127.0.0.1", port=primary.port)
    try:
        deadline = time.monotonic() + 30
        while int(conn.info("replication").get("connected_slaves", 0)) < 1 or (
            conn.info("replication").get("slave0", {}).get("state") != "online"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield primary
    finally:
        conn.close()


@pytest.mark.parametrize("replicas", [0, 1])
def test_replicas_with_reentry(replicated: RedisServer, prefix: str, replicas: int) -> None:
    client = redmutex.Client(replicated.url, prefix=prefix, command_timeout=2.0)
    try:
        lock = redmutex.Lock(client, "rep", ttl=10, replicas=replicas, reentrant=True)
        other = redmutex.Lock(client, "rep", ttl=10)
        with lock:
            fence = lock.fence
            with lock, lock:
                assert lock.fence == fence and lock._depth == 3
                assert not other.acquire(blocking=False)
            assert not other.acquire(blocking=False)
        assert other.acquire(blocking=False)
        other.release()
    finally:
        client.close()


# ------------------------------------------------------------------------------ command line


def test_cli_shows_the_hold_count(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "counted", ttl=30, reentrant=True)
    plain = redmutex.Lock(client, "uncounted", ttl=30)
    assert lock.acquire() and lock.acquire() and lock.acquire() and plain.acquire()
    where = ("--redis", redis_url, "--prefix", prefix)
    done = cli("status", "counted", *where, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["holds"] == 3 and data["lock"]["holder"] == (lock.token or "")[:8]
    done = cli("status", "counted", *where)
    assert "hold count 3" in done.stdout, done.stdout
    done = cli("status", "uncounted", *where)
    assert "hold count" not in done.stdout, done.stdout
    done = cli("list", *where, "--json")
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["counted"]["holds"] == 3 and rows["uncounted"]["holds"] == 1
    done = cli("list", *where)
    line = next(x for x in done.stdout.splitlines() if "counted" in x and "uncounted" not in x)
    assert "hold count 3" in line, done.stdout
    # A forced release frees the whole hold; its stale count is not shown for a new holder.
    done = cli("release", "counted", "--force", "--yes", *where)
    assert done.returncode == 0, done.stderr
    other = redmutex.Lock(client, "counted", ttl=30)
    assert other.acquire(blocking=False)
    done = cli("status", "counted", *where, "--json")
    assert json.loads(done.stdout)["holds"] == 1
    other.release()
    for _ in range(3):
        with pytest.raises(redmutex.LockLostError):
            lock.release()
    plain.release()


def test_reentry_on_redlock() -> None:
    # On independent masters the re-entry and the nested release run on every master and count
    # by majority, like extend and release.
    from _scale_servers import Masters

    with Masters(3) as masters:
        client = redmutex.Client(masters.urls, prefix="t:", command_timeout=2.0)
        try:
            lock = redmutex.Lock(client, "rl-reentrant", ttl=10, reentrant=True)
            other = redmutex.Lock(client, "rl-reentrant", ttl=10)
            with lock:
                fence = lock.fence
                with lock:
                    assert lock.fence == fence and lock._depth == 2 and lock.owned()
                    assert not other.acquire(blocking=False)
                assert not other.acquire(blocking=False)
            assert other.acquire(blocking=False)
            other.release()
        finally:
            client.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
def test_cancelled_reentries_keep_the_count(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    # A re-entry cancelled at any point either counts (acquire returned True) or leaves the
    # count as it was: the hold then ends with exactly as many releases as acquires that
    # returned True. (asyncio.timeout cancels in the same task; for wait_for's own task before
    # Python 3.12 see test_aio_reentrant_wait_for.py.)
    async def main() -> tuple[int, int]:
        lock = redmutex.aio.Lock(client, "cancelled", ttl=10, reentrant=True)
        assert await lock.acquire()
        depth, cancelled = 1, 0
        deadline = time.monotonic() + 5
        for i in range(300):
            if time.monotonic() > deadline:
                break
            try:
                async with asyncio.timeout((i % 20) * 0.0001):
                    assert await lock.acquire()
                depth += 1
            except TimeoutError:
                cancelled += 1
            assert lock._core._depth == depth
        await asyncio.sleep(0.3)  # counts given back in the background have landed
        value = r.get(holds_key(prefix, "cancelled"))
        assert value == (None if depth == 1 else f"{lock.token} {depth}".encode())
        for _ in range(depth):
            await lock.release()
        assert not await lock.locked()
        return depth, cancelled

    depth, cancelled = asyncio.run(main())
    assert depth > 1 and cancelled > 0, (depth, cancelled)


@pytest.mark.timeout(60)
def test_a_nested_release_that_never_reached_redis_leaves_nothing_after_the_last(
    redis_server: RedisServer, r: redis.Redis, prefix: str
) -> None:
    """The nested release fails (Redis unreachable), so Redis keeps the count of 2 and so does
    the object (the release did not count: see the retry test below); a retry and the last
    release still leave nothing but the fence counter (API.md). Before, the count stayed for
    the whole lease (10 of 10 in the helper's script)."""
    with (
        FaultProxy(redis_server.port) as proxy,
        redmutex.Client(
            proxy.url, prefix=prefix, connect_timeout=0.5, command_timeout=0.5
        ) as client,
    ):
        lock = redmutex.Lock(client, "dark-nested", ttl=20, reentrant=True)
        assert lock.acquire(timeout=2) and lock.acquire(timeout=2)
        assert r.get(holds_key(prefix, "dark-nested")) is not None
        proxy.blackhole()
        with pytest.raises(redmutex.ConnectionError):
            lock.release()
        proxy.heal()
        assert lock._depth == 2  # unanswered: the level is still held
        lock.release()  # the retry
        assert lock._depth == 1
        lock.release()  # the outermost hold
        assert lock.token is None
        assert r.get(lock_key(prefix, "dark-nested")) is None
        assert r.get(holds_key(prefix, "dark-nested")) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lost", ["reply", "request"])
def test_a_retried_nested_release_is_that_release_not_the_outer_one(
    redis_server: RedisServer, r: redis.Redis, prefix: str, lost: str
) -> None:
    """At depth 2 the nested release raises ConnectionError (its reply or its request lost).
    The caller retries, as for a plain lock: that is the same nested release, so the outer
    hold stays, in Redis too, and nobody else gets the lock while the outer block runs.
    Before, the failed release had lowered the count already and the retry released the
    outer hold (5 of 5 in the helper's script)."""
    name = f"retry-nested-{lost}"
    with (
        FaultProxy(redis_server.port) as proxy,
        redmutex.Client(proxy.url, prefix=prefix, connect_timeout=1, command_timeout=1) as client,
        redmutex.Client(redis_server.url, prefix=prefix) as other_client,
    ):
        lock = redmutex.Lock(client, name, ttl=20, reentrant=True)
        assert lock.acquire(timeout=5) and lock.acquire(timeout=5)
        if lost == "reply":
            proxy.drop_reply_to(f"{{{name}}}".encode(), then_blackhole=True)
        else:
            proxy.blackhole()
        with pytest.raises(redmutex.ConnectionError):
            lock.release()
        proxy.heal()
        proxy.disarm()
        assert lock._depth == 2
        lock.release()  # the retry
        assert lock._depth == 1 and lock.owned() and not lock.lost
        assert r.get(lock_key(prefix, name)) == lock.token.encode()
        assert r.get(holds_key(prefix, name)) is None
        other = redmutex.Lock(other_client, name, ttl=20)
        assert not other.acquire(blocking=False)
        lock.release()
        assert other.acquire(blocking=False)
        other.release()


@pytest.mark.timeout(60)
def test_a_with_block_whose_nested_release_raised_gives_its_level_up(
    redis_server: RedisServer, r: redis.Redis, prefix: str
) -> None:
    """A block's exit cannot be retried: when the inner block's release raises ConnectionError,
    its level goes anyway (Redis is told in the background), and the outer block's exit
    releases the lock, leaving nothing but the fence counter."""
    name = "with-nested-dark"
    with (
        FaultProxy(redis_server.port) as proxy,
        redmutex.Client(
            proxy.url, prefix=prefix, connect_timeout=0.5, command_timeout=0.5
        ) as client,
    ):
        lock = redmutex.Lock(client, name, ttl=20, reentrant=True, auto_renew=True)
        with lock:
            with pytest.raises(redmutex.ConnectionError), lock:
                assert lock._depth == 2
                proxy.blackhole()
            proxy.heal()
            assert lock._depth == 1 and lock.owned()
        assert lock.token is None and not lock.lost
        assert r.get(lock_key(prefix, name)) is None
        assert r.get(holds_key(prefix, name)) is None
