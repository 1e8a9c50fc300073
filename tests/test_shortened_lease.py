"""A holder that shortens its lease with `extend(ttl)` and then never releases (it crashed, or
forgot): its waiters must notice the new end when it comes, as they notice any lease end
("a lease that expires without a release is noticed when it ends"), not at their next queue
place refresh (0.67 s unfair, 2 s fair) or the old end."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redmutex
from _scale_servers import Masters

Holding = Callable[[redmutex.Client, str], object]


def _lock(**kw: object) -> Holding:
    return lambda c, n: redmutex.Lock(c, n, **kw)  # type: ignore[arg-type]


def _semaphore(**kw: object) -> Holding:
    return lambda c, n: redmutex.Semaphore(c, n, 1, **kw)  # type: ignore[arg-type]


# (holder, waiter): each makes a primitive object on (client, name) that has acquire/release.
CASES: dict[str, tuple[Holding, Holding]] = {
    "lock": (_lock(ttl=30), _lock(ttl=5)),
    "lock-fair-waiter": (_lock(ttl=30), _lock(ttl=5, fair=True)),
    "reentrant": (_lock(ttl=30, reentrant=True), _lock(ttl=5)),
    "multilock": (
        lambda c, n: redmutex.MultiLock(c, [n, n + "-b"], ttl=30),
        _lock(ttl=5),
    ),
    "semaphore": (_semaphore(ttl=30, fair=False), _semaphore(ttl=5, fair=False)),
    "semaphore-fair": (_semaphore(ttl=30, fair=True), _semaphore(ttl=5, fair=True)),
    "rw-writer-held": (
        lambda c, n: redmutex.RWLock(c, n, ttl=30).write(),
        lambda c, n: redmutex.RWLock(c, n, ttl=5).read(),
    ),
    "rw-reader-held": (
        lambda c, n: redmutex.RWLock(c, n, ttl=30).read(),
        lambda c, n: redmutex.RWLock(c, n, ttl=5).write(),
    ),
}

SHORTEN_AT = 0.75  # after the waiter started: just past an unfair waiter's first place refresh
NEW_LEASE = 0.1
LATE_BOUND = 0.35  # generous for a loaded 2-core machine; the refreshes come 0.5 s+ later


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_waiter_notices_a_shortened_lease_when_it_ends(
    client: redmutex.Client, other_client: redmutex.Client, case: str
) -> None:
    check_shortened_lease(client, other_client, case)


@pytest.mark.timeout(90)
def test_on_redlock_too() -> None:
    """The Redlock holds' extends (a semaphore's by slot) wake the waiters on every master."""
    with Masters(3) as masters:
        for case in ("lock", "semaphore", "rw-reader-held"):
            holder_client = redmutex.Client(masters.urls)
            waiter_client = redmutex.Client(masters.urls)
            check_shortened_lease(holder_client, waiter_client, case)


def check_shortened_lease(
    client: redmutex.Client, other_client: redmutex.Client, case: str
) -> None:
    make_holder, make_waiter = CASES[case]
    n = "short-" + uuid.uuid4().hex[:12]
    holder = make_holder(client, n)
    assert holder.acquire(blocking=False)  # type: ignore[attr-defined]
    got: list[tuple[bool, float]] = []
    waiting = threading.Event()
    started: list[float] = []

    def wait() -> None:
        waiter = make_waiter(other_client, n)
        started.append(time.monotonic())
        waiting.set()
        acquired = waiter.acquire(timeout=10)  # type: ignore[attr-defined]
        got.append((acquired, time.monotonic()))
        if acquired:
            waiter.release()  # type: ignore[attr-defined]

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(10)
    # From when the waiter began (its queue place refreshes count from there).
    time.sleep(max(0.0, started[0] + SHORTEN_AT - time.monotonic()))
    holder.extend(NEW_LEASE)  # type: ignore[attr-defined]
    ends = time.monotonic() + NEW_LEASE  # no later than this; the holder now "crashes"
    thread.join(15)
    assert got, "the waiter never returned"
    acquired, at = got[0]
    assert acquired
    late = at - ends
    assert late < LATE_BOUND, f"{case}: the waiter got in {late:.2f} s after the shortened end"
