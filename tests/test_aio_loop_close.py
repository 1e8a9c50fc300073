"""An event loop closed (without cancelling its tasks) while an asyncio acquire waits or a fill
runs, as a worker thread's `loop.run_until_complete(...)` then `loop.close()` does: the tasks of
that loop never run again, so what they wait for or hold belongs to nobody.

Before, the waiting acquire went on in the runtime and took the lock at the next release (a
whole ttl for nobody), and with `auto_renew=True` kept it, renewed, for the life of the process
(an audit found it); a fill's claim was renewed likewise, so every other caller of that entry
timed out. Closing the loop now abandons its acquires and gives its fill claims back."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redmutex
from redmutex import _aio_bridge, aio

WAITERS: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=1, auto_renew=True),
    "fair lock": lambda c, n: aio.Lock(c, n, ttl=1, auto_renew=True, fair=True),
    "plain lock": lambda c, n: aio.Lock(c, n, ttl=1),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=1, auto_renew=True),
}
HOLDERS: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: redmutex.Lock(c, n, ttl=30),
    "fair lock": lambda c, n: redmutex.Lock(c, n, ttl=30, fair=True),
    "plain lock": lambda c, n: redmutex.Lock(c, n, ttl=30),
    "semaphore": lambda c, n: redmutex.Semaphore(c, n, 1, ttl=30),
}


def _run_then_close(start: Callable[[], Any], kept: list[Any]) -> None:
    """A worker thread's loop: starts a task (kept referenced, as asyncio's docs advise), runs
    briefly, and is closed with the task still pending."""

    def worker() -> None:
        loop = asyncio.new_event_loop()
        kept.append(loop.create_task(start()))
        loop.run_until_complete(asyncio.sleep(0.3))
        loop.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("kind", WAITERS)
def test_closing_the_loop_abandons_its_waiting_acquire(
    client: redmutex.Client, other_client: redmutex.Client, kind: str
) -> None:
    name = f"loop-close-{kind.replace(' ', '-')}"
    holder = HOLDERS[kind](other_client, name)
    assert holder.acquire(timeout=5)
    waiter = WAITERS[kind](client, name)
    kept: list[Any] = []
    _run_then_close(lambda: waiter.acquire(timeout=60), kept)
    holder.release()
    time.sleep(2.5)  # past the waiter's ttl: a hold it took would be renewed by now
    assert waiter.token is None
    again = HOLDERS[kind](other_client, name)
    assert again.acquire(timeout=0), "the closed loop's acquire took it"
    again.release()


def test_closing_the_loop_gives_its_fills_claim_back(
    client: redmutex.Client, r: redis.Redis, key_of: Callable[[str, str], bytes]
) -> None:
    key = "loop-close-fill"

    async def slow() -> str:
        await asyncio.sleep(60)
        return "slow"

    kept: list[Any] = []
    _run_then_close(lambda: aio.get_or_fill(client, key, slow, ttl=30, lock_ttl=1), kept)
    started = time.monotonic()
    value = redmutex.get_or_fill(client, key, lambda: "fast", ttl=30, lock_ttl=1, timeout=10)
    assert value == "fast"
    assert time.monotonic() - started < 2  # not renewed: at most its lease (1 s)
    assert not r.exists(key_of(key, "fill"))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
def test_ended_and_cancelled_acquires_are_not_kept_for_the_loops_close(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    """Each acquire is noted on its loop until it ends; a cancelled one (its task aborted) too."""
    holder = redmutex.Lock(other_client, "loop-close-noted", ttl=30)
    assert holder.acquire(timeout=5)

    async def main() -> int:
        lock = aio.Lock(client, "loop-close-noted", ttl=5)
        for _ in range(50):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.01):
                    await lock.acquire()
        for _ in range(20):
            assert not await lock.acquire(timeout=0.01)
        await asyncio.sleep(0.2)  # the aborted tasks are dropped on the runtime
        waker: Any = _aio_bridge.waker_for(asyncio.get_running_loop())
        return int(waker._acquires_under_way())

    try:
        assert asyncio.run(main()) == 0
    finally:
        holder.release()


class _LoopWithoutAttributes(asyncio.SelectorEventLoop):
    """A loop whose class takes no new instance attributes (as a C-implemented one may)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("close", "_redmutex_close", "_redmutex_opening", "_redmutex_conns"):
            raise AttributeError(name)
        super().__setattr__(name, value)


def test_a_loop_that_takes_no_attributes_still_works_without_the_close_hook(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    """Hooking the close of every loop the bridge serves made each call through the runtime
    raise AttributeError on such a loop (a review found it)."""
    holder = redmutex.Lock(other_client, "loop-close-no-attributes", ttl=30)
    assert holder.acquire(timeout=5)

    async def main() -> bool:
        lock = aio.Lock(client, "loop-close-no-attributes", ttl=5)
        waiting = asyncio.create_task(lock.acquire(timeout=10))  # busy: through the runtime
        await asyncio.sleep(0.2)
        holder.release()
        got = await waiting
        await lock.release()
        return got

    loop = _LoopWithoutAttributes()
    try:
        assert loop.run_until_complete(main())
    finally:
        loop.close()
