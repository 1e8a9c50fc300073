"""An auto-renewed asyncio hold whose event loop is closed while it still holds: its owner (a task
of that loop) is gone and nobody can release it any more, so its renewal ends and the name is
free within the ttl, even though the object itself lives on (a module-level lock, a task object
kept referenced). Before, the runtime renewed it for as long as the object lived: the name was
held for good."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import redmutex
from redmutex import aio

# Renewal runs every ttl/3, so a hold rides out stalls of a starved machine up to 2/3 ttl.
TTL = 1.2
# A hold still renewed is held after this, an abandoned one is not.
MARGIN = 2.0
# Held this long while the loop lives: unrenewed, the lease would have ended.
LIVED = 2 * TTL

KINDS: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: aio.Lock(c, n, ttl=TTL, auto_renew=True),
    "lock-reentrant": lambda c, n: aio.Lock(c, n, ttl=TTL, auto_renew=True, reentrant=True),
    "semaphore": lambda c, n: aio.Semaphore(c, n, 1, ttl=TTL, auto_renew=True),
    "rw-write": lambda c, n: aio.RWLock(c, n, ttl=TTL, auto_renew=True).write(),
    "multilock": lambda c, n: aio.MultiLock(c, [n, f"{n}-2"], ttl=TTL, auto_renew=True),
}

#: The synchronous probe of each kind, on another client: whether it can take the name now.
PROBES: dict[str, Callable[[redmutex.Client, str], Any]] = {
    "lock": lambda c, n: redmutex.Lock(c, n, ttl=5),
    "lock-reentrant": lambda c, n: redmutex.Lock(c, n, ttl=5),
    "semaphore": lambda c, n: redmutex.Semaphore(c, n, 1, ttl=5),
    "rw-write": lambda c, n: redmutex.RWLock(c, n, ttl=5).write(),
    "multilock": lambda c, n: redmutex.MultiLock(c, [n, f"{n}-2"], ttl=5),
}


def free_within(probe: Any, limit: float) -> float | None:
    """Seconds until `probe` could take the name (given back at once), None if not in `limit`."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if probe.acquire(blocking=False):
            probe.release()
            return time.monotonic() - start
        time.sleep(0.05)
    return None


#: How the loop ends while the hold is held. A re-entrant Lock's owner is the task, whose hold
#: ends with it: only a task left pending keeps one.
CASES = [
    (kind, how)
    for kind in KINDS
    for how in ["task-left-pending", "acquired-then-closed", "asyncio-run"]
    if kind != "lock-reentrant" or how == "task-left-pending"
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "how"), CASES)
def test_closing_the_loop_ends_the_renewal_of_its_holds(
    client: redmutex.Client, other_client: redmutex.Client, kind: str, how: str
) -> None:
    name = f"abandoned-{kind}-{how}"
    hold = KINDS[kind](client, name)
    probe = PROBES[kind](other_client, name)
    kept: list[Any] = []  # the task stays referenced, as the object does

    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with hold:
            entered.set()
            await asyncio.Event().wait()

    if how == "asyncio-run":
        assert asyncio.run(hold.acquire())
    else:
        loop = asyncio.new_event_loop()
        if how == "task-left-pending":
            kept.append(loop.create_task(hold_forever()))
            loop.run_until_complete(asyncio.wait_for(entered.wait(), 30))
        else:
            assert loop.run_until_complete(hold.acquire())
        # Renewed while the loop lives (even when it does not run).
        time.sleep(LIVED)
        assert free_within(probe, 0.1) is None, "not renewed while the loop lived"
        loop.close()
    assert hold.token is not None  # the object still holds: only the renewal ended
    took = free_within(probe, TTL + MARGIN)
    # The task's coroutine is closed now, with no loop running (its exit cannot release): left
    # to the garbage collector, it would run its exit in whichever loop runs then.
    for task in kept:
        with contextlib.suppress(RuntimeError):
            task.get_coro().close()
    assert took is not None, f"{kind} {how}: still held {TTL + MARGIN} s after the loop closed"


def test_a_reentrant_lock_is_described_outside_a_running_loop(client: redmutex.Client) -> None:
    """`token`, `fence`, `lost` and `remaining()` are plain properties: outside a running loop
    (after `asyncio.run`) they describe the object too, where they raised RuntimeError ("no
    running event loop") for a re-entrant Lock."""
    lock = aio.Lock(client, "described", ttl=5, reentrant=True)
    assert lock.token is None
    assert lock.fence is None
    assert lock.lost is False
    assert lock.remaining() is None


def run_in_a_thread(work: Callable[[], Any]) -> Any:
    """`work()` run on a thread of its own (which then ends), its result handed back."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(30)
    assert result, "the thread did not finish"
    return result[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_loop_closed_by_another_thread_ends_the_renewal_of_its_holds(
    client: redmutex.Client, other_client: redmutex.Client, kind: str
) -> None:
    """The thread that closes a loop need not be the one that ran it. A re-entrant Lock's hold
    is the loop thread's, inside the object of its task: before, ending its renewal from another
    thread looked for a hold of that other thread, found none, and the name stayed held for
    good (failed 3 of 3 before; the other kinds passed)."""
    name = f"closed-elsewhere-{kind}"
    hold = KINDS[kind](client, name)
    probe = PROBES[kind](other_client, name)

    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with hold:
            entered.set()
            await asyncio.Event().wait()

    def start() -> tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]:
        loop = asyncio.new_event_loop()
        task = loop.create_task(hold_forever())
        loop.run_until_complete(asyncio.wait_for(entered.wait(), 30))
        return loop, task

    loop, task = run_in_a_thread(start)
    time.sleep(LIVED)
    assert free_within(probe, 0.1) is None, "not renewed while the loop lived"
    loop.close()
    took = free_within(probe, TTL + MARGIN)
    with contextlib.suppress(RuntimeError):  # as above: its exit cannot release
        task.get_coro().close()
    assert took is not None, f"{kind}: still held {TTL + MARGIN} s after the loop was closed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ran_on", ["this-thread", "another-thread"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_loop_left_to_the_garbage_collector_ends_the_renewal_of_its_holds(
    client: redmutex.Client, other_client: redmutex.Client, kind: str, ran_on: str
) -> None:
    """A loop nobody closes is closed by the garbage collector (`BaseEventLoop.__del__`), on
    whichever thread collects. Before, the loop kept the holds to stop in a weak mapping of its
    own, which the collector empties (it clears the weak references that only garbage refers
    to) before it closes the loop: every kind but the re-entrant Lock (whose hold goes with its
    task's object) was renewed for good."""
    name = f"collected-{kind}-{ran_on}"
    hold = KINDS[kind](client, name)
    probe = PROBES[kind](other_client, name)

    async def hold_forever(entered: asyncio.Event) -> None:
        # No `async with`: the collector closes this coroutine, which then runs no exit.
        assert await hold.acquire()
        entered.set()
        await asyncio.Event().wait()

    def start() -> weakref.ref[asyncio.AbstractEventLoop]:
        # The event is bound to the loop: only the garbage (the task) may refer to it after.
        entered = asyncio.Event()
        loop = asyncio.new_event_loop()
        loop.create_task(hold_forever(entered))
        loop.run_until_complete(asyncio.wait_for(entered.wait(), 30))
        return weakref.ref(loop)

    loop = start() if ran_on == "this-thread" else run_in_a_thread(start)
    time.sleep(LIVED)
    assert free_within(probe, 0.1) is None, "not renewed while the loop lived"
    gc.collect()
    assert loop() is None, "the loop was not collected"
    took = free_within(probe, TTL + MARGIN)
    assert took is not None, f"{kind}: still held {TTL + MARGIN} s after the loop was collected"
