"""redmutex.metrics hooks, and the `redmutex` logger (which never carries a password)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
import redmutex
from redmutex import aio, metrics
from redmutex._server import RedisServer
from redmutex.metrics import AcquireEvent, ReleaseEvent


class Recorder:
    def __init__(self) -> None:
        self.acquired: list[AcquireEvent] = []
        self.released: list[ReleaseEvent] = []

    def install(self) -> None:
        metrics.set_hooks(on_acquire=self.acquired.append, on_release=self.released.append)


@pytest.fixture
def events() -> Iterator[Recorder]:
    recorder = Recorder()
    recorder.install()
    try:
        yield recorder
    finally:
        metrics.clear_hooks()


def name_() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def test_redis_lock_reports_wait_and_hold(client: redmutex.Client, events: Recorder) -> None:
    name = name_()
    with redmutex.redis_lock(client, name):
        time.sleep(0.05)
    assert len(events.acquired) == 1 and len(events.released) == 1
    acquired, released = events.acquired[0], events.released[0]
    assert (acquired.name, acquired.kind, acquired.acquired) == (name, "lock", True)
    assert 0 <= acquired.waited < 5
    assert (released.name, released.kind, released.lost) == (name, "lock", False)
    assert 0.05 <= released.held < 5


def test_acquire_lock_wait_is_measured(client: redmutex.Client, events: Recorder) -> None:
    name = name_()
    first = redmutex.acquire_lock(client, name, ltime=0.3)
    assert first
    second = redmutex.acquire_lock(client, name, atime=5)  # waits for the 0.3 s lease to end
    assert second
    assert [e.acquired for e in events.acquired] == [True, True]
    assert events.acquired[1].waited >= 0.1
    assert redmutex.release_lock(client, name, first) is False  # its lease had ended
    assert redmutex.release_lock(client, name, second) is True
    assert [e.lost for e in events.released] == [True, False]


def test_a_timeout_is_reported_as_not_acquired(client: redmutex.Client, events: Recorder) -> None:
    name = name_()
    holder = redmutex.Lock(client, name, ttl=10)
    holder.acquire()
    try:
        assert redmutex.acquire_lock(client, name, atime=0.1) is False
        with (
            pytest.raises(redmutex.LockTimeoutError),
            metrics.measured(redmutex.Lock(client, name, timeout=0.1)),
        ):
            pass
    finally:
        holder.release()
    assert [e.acquired for e in events.acquired] == [False, False]
    assert all(e.waited >= 0.09 for e in events.acquired)
    assert events.released == []


def test_locked_decorator_reports(client: redmutex.Client, events: Recorder) -> None:
    @redmutex.locked(client, "game:{game_id}")
    def play(game_id: int) -> int:
        return game_id * 2

    assert play(21) == 42
    assert [(e.name, e.kind) for e in events.acquired] == [("game:21", "lock")]
    assert [(e.name, e.lost) for e in events.released] == [("game:21", False)]


def test_aio_locked_decorator_reports_like_the_blocking_one(
    client: redmutex.Client, events: Recorder
) -> None:
    @aio.locked(client, "game:{game_id}")
    async def play(game_id: int) -> int:
        await asyncio.sleep(0.02)
        return game_id * 2

    assert asyncio.run(play(21)) == 42
    assert [(e.name, e.kind, e.acquired) for e in events.acquired] == [("game:21", "lock", True)]
    assert [(e.name, e.lost) for e in events.released] == [("game:21", False)]
    assert events.released[0].held >= 0.02


def test_aio_locked_async_generator_reports_one_hold_for_the_iteration(
    client: redmutex.Client, events: Recorder
) -> None:
    @aio.locked(client, "feed:{feed_id}")
    async def feed(feed_id: int) -> AsyncIterator[int]:
        for i in range(2):
            await asyncio.sleep(0.01)
            yield feed_id + i

    async def main() -> list[int]:
        return [item async for item in feed(7)]

    assert asyncio.run(main()) == [7, 8]
    assert [(e.name, e.acquired) for e in events.acquired] == [("feed:7", True)]
    assert [(e.name, e.lost) for e in events.released] == [("feed:7", False)]
    assert events.released[0].held >= 0.02


def test_measured_knows_the_kinds(client: redmutex.Client, events: Recorder) -> None:
    name = name_()
    rw = redmutex.RWLock(client, name)
    with metrics.measured(redmutex.Semaphore(client, name, 2)) as sem:
        assert isinstance(sem, redmutex.Semaphore)  # `as` binds the lock object itself
    with metrics.measured(rw.read()):
        pass
    with metrics.measured(rw.write()):
        pass
    kinds = ["semaphore", "rwlock.read", "rwlock.write"]
    assert [e.kind for e in events.acquired] == kinds
    assert [e.kind for e in events.released] == kinds


def test_measured_reports_a_lost_lease(
    client: redmutex.Client, r: redis.Redis, prefix: str, events: Recorder
) -> None:
    name = name_()
    with (
        pytest.raises(redmutex.LockLostError),
        metrics.measured(redmutex.Lock(client, name, ttl=10)),
    ):
        r.delete((prefix + "{" + name + "}:lock").encode())
    assert [e.lost for e in events.released] == [True]


def test_measured_with_asyncio(client: redmutex.Client, events: Recorder) -> None:
    name = name_()

    async def main() -> None:
        async with metrics.measured(aio.Lock(client, name)) as lock:
            assert isinstance(lock, aio.Lock)
            await asyncio.sleep(0.02)

    asyncio.run(main())
    assert [(e.name, e.kind, e.acquired) for e in events.acquired] == [(name, "lock", True)]
    assert events.released[0].held >= 0.02


def test_without_hooks_nothing_is_reported(client: redmutex.Client) -> None:
    seen: list[object] = []
    metrics.set_hooks(on_acquire=seen.append)
    metrics.clear_hooks()
    with redmutex.redis_lock(client, name_()):
        pass
    with metrics.measured(redmutex.Lock(client, name_())):
        pass
    assert seen == []
    assert metrics._active is None


def test_only_one_hook(client: redmutex.Client) -> None:
    seen: list[ReleaseEvent] = []
    metrics.set_hooks(on_release=seen.append)
    try:
        with redmutex.redis_lock(client, name_()):
            pass
    finally:
        metrics.clear_hooks()
    assert len(seen) == 1


def test_a_failing_hook_is_logged_and_ignored(
    client: redmutex.Client, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: AcquireEvent) -> None:
        raise RuntimeError("hook bug")

    metrics.set_hooks(on_acquire=broken)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="redmutex"),
            redmutex.redis_lock(client, name_()) as identifier,
        ):
            assert identifier
    finally:
        metrics.clear_hooks()
    records = [r for r in caplog.records if r.name == "redmutex"]
    assert len(records) == 1 and "metrics hook" in records[0].getMessage()
    assert records[0].exc_info is not None


class _Interrupt(BaseException):
    """Stands for Ctrl-C (KeyboardInterrupt) or SystemExit arriving in a hook."""


def _interrupting(event: AcquireEvent) -> None:
    if event.acquired:
        raise _Interrupt


@pytest.mark.parametrize("how", ["measured", "measured-aio", "acquire_lock", "locked"])
def test_an_interrupted_hook_does_not_leave_the_lock_held(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes], how: str
) -> None:
    # A hook that is interrupted after the hold was taken kept it: `with` never reached its
    # exit, and acquire_lock never returned the identifier to release with.
    name = name_()
    metrics.set_hooks(on_acquire=_interrupting)
    try:
        with pytest.raises(_Interrupt):
            if how == "measured":
                with metrics.measured(redmutex.Semaphore(client, name, 1, auto_renew=True)):
                    pass
            elif how == "measured-aio":

                async def enter() -> None:
                    async with metrics.measured(aio.Lock(client, name, auto_renew=True)):
                        pass

                asyncio.run(enter())
            elif how == "acquire_lock":
                redmutex.acquire_lock(client, name)
            else:

                @redmutex.locked(client, name)
                def body() -> None:
                    pass

                body()
    finally:
        metrics.clear_hooks()
    left = [k for k in r.scan_iter(match=key_of(name, "*")) if not k.endswith(b":fence")]
    assert not left, f"left held after the interrupted hook: {left}"
    other: redmutex.Lock | redmutex.Semaphore = (
        redmutex.Semaphore(client, name, 1) if how == "measured" else redmutex.Lock(client, name)
    )
    assert other.acquire(blocking=False)
    other.release()


def test_hooks_must_be_callable() -> None:
    with pytest.raises(TypeError, match="on_acquire"):
        metrics.set_hooks(on_acquire=42)  # type: ignore[arg-type]
    assert metrics._active is None


def test_threads_share_the_hooks(client: redmutex.Client, events: Recorder) -> None:
    name = name_()

    def work() -> None:
        for _ in range(5):
            with redmutex.redis_lock(client, name):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(events.acquired) == 20 and len(events.released) == 20
    assert metrics._recipe_starts == {}


# -- the redmutex logger ----------------------------------------------------------------------

SECRET = "L0g-Secret-Pa55word"


def test_lost_leases_are_logged_without_secrets(
    make_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server(["--requirepass", SECRET])
    url = f"redis://default:{SECRET}@127.0.0.1:{server.port}/0"
    client = redmutex.Client(url, prefix="log:")
    conn = redis.Redis(host="127.0.0.1", port=server.port, password=SECRET)
    lost = threading.Event()
    with caplog.at_level(logging.WARNING, logger="redmutex"):
        lock = redmutex.Lock(client, "job", ttl=0.3, auto_renew=True, on_lost=lambda _: lost.set())
        with pytest.raises(ValueError, match="body"), lock:
            conn.delete(b"log:{job}:lock")
            assert lost.wait(10)
            raise ValueError("body failed")
        deadline = time.monotonic() + 5
        while len([r for r in caplog.records if r.name == "redmutex"]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    conn.close()
    client.close()
    records = [r for r in caplog.records if r.name == "redmutex"]
    texts = [caplog.text] + [r.getMessage() for r in records]
    assert any("lock 'job' was lost" in t for t in texts)
    assert any("on leaving a block that raised" in t for t in texts)
    assert all(r.levelno == logging.WARNING for r in records)
    assert not any(SECRET in t for t in texts)


def test_measured_reports_each_nested_hold_of_a_reentrant_lock(
    client: redmutex.Client, events: Recorder
) -> None:
    """A nested `with` on one measured re-entrant lock overwrote the outer hold's start, and
    its exit cleared it: 2 acquires and 1 release were reported, with the inner hold's time."""
    measured = metrics.measured(redmutex.Lock(client, name_(), ttl=10, reentrant=True))
    with measured:
        time.sleep(0.05)
        with measured:
            time.sleep(0.05)
        time.sleep(0.05)
    assert [e.acquired for e in events.acquired] == [True, True]
    inner, outer = events.released
    assert 0.04 < inner.held < outer.held and outer.held >= 0.14
