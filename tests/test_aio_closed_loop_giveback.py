"""An asyncio acquire on the event loop's own connection whose request is held up on its way to
Redis past `command_timeout` raises, and `asyncio.run()` returns right after: the loop closes
before the late request lands. Its give-back must still follow the request.

Before, closing the loop closed the connection and gave back at once; the held-back request then
ran and set the names for a token nobody knows, for the whole 10 s lease (measured 9.5 s).
Closing now hands the connection, its unanswered calls in line, to the runtime, which gives back
after their replies come (see `engine::loop_leftover`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redmutex
from _proxy import FaultProxy
from redmutex import aio
from redmutex._core import _aio_calls
from redmutex._server import RedisServer

# How long the proxy holds the request back.
HELD = 1.5
# How late an event that the contract ties to a moment may come on a shared, loaded 2-core box.
LATE = 1.5

# The asyncio hold of each kind, and a blocking hold of the same names for another client.
KINDS: dict[str, tuple[Callable[[redmutex.Client, list[str]], Any], Callable[..., Any]]] = {
    "aio-lock": (
        lambda c, names: aio.Lock(c, names[0], ttl=10),
        lambda c, names: redmutex.Lock(c, names[0], ttl=5),
    ),
    "aio-multilock": (
        lambda c, names: aio.MultiLock(c, names, ttl=10),
        lambda c, names: redmutex.MultiLock(c, names, ttl=5),
    ),
    "aio-semaphore": (
        lambda c, names: aio.Semaphore(c, names[0], 1, ttl=10),
        lambda c, names: redmutex.Semaphore(c, names[0], 1, ttl=5),
    ),
    "aio-write": (
        lambda c, names: aio.RWLock(c, names[0], ttl=10).write(),
        lambda c, names: redmutex.RWLock(c, names[0], ttl=5).write(),
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_give_back_follows_a_late_attempt_after_the_loop_closed(
    make_server: Callable[..., RedisServer], prefix: str, kind: str
) -> None:
    make_aio, make_other = KINDS[kind]
    server = make_server()
    names = [f"closed-loop-late-{kind}-a", f"closed-loop-late-{kind}-b"]
    with FaultProxy(server.port) as proxy:
        c = redmutex.Client(proxy.url, prefix=prefix, connect_timeout=1.0, command_timeout=0.3)
        other_client = redmutex.Client(server.url, prefix=prefix)
        reset = threading.Timer(0.15, lambda: proxy.set_latency(0.0, "c2s"))
        sent: list[float] = []
        conns: list[int] = []

        async def main() -> None:
            warm = make_aio(c, names)  # on this loop: its connection is open, the script loaded
            assert await warm.acquire(timeout=0)
            await warm.release()
            loop_calls = _aio_calls()[0]
            hold = make_aio(c, names)
            proxy.set_latency(HELD, "c2s")
            conns.append(proxy.connections())  # the loop's own among them
            reset.start()
            sent.append(time.monotonic())
            with pytest.raises(redmutex.ConnectionError):
                await hold.acquire(timeout=0)
            assert _aio_calls()[0] == loop_calls + 1, "not sent on the loop's connection"

        try:
            asyncio.run(main())  # the loop closes right after the acquire raised
            returned = time.monotonic() - sent[0]
            reset.join()
            # The closing loop waits for nothing: the late request is still held back.
            assert returned < HELD - 0.3, f"asyncio.run() returned after {returned:.3f} s"
            names_come_free(sent[0], names, kind, make_other, other_client, "late")
            # The loop's connection, handed over, is closed once its late call was answered.
            deadline = time.monotonic() + LATE
            while proxy.connections() >= conns[0] and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proxy.connections() < conns[0], "the loop's connection was left open"
        finally:
            c.close()
            other_client.close()


def names_come_free(
    sent: float,
    names: list[str],
    kind: str,
    make_other: Callable[..., Any],
    other_client: redmutex.Client,
    attempt: str,
) -> None:
    """Once the held-back request has reached Redis (about HELD s after it was `sent`), another
    client gets each name the attempt took, soon: the give-back followed the request."""
    time.sleep(max(0.0, sent + HELD + 0.5 - time.monotonic()))
    for name in names[: 2 if kind == "aio-multilock" else 1]:
        looked_at = time.monotonic()
        other = make_other(other_client, [name])
        got = other.acquire(timeout=6)
        waited = time.monotonic() - looked_at
        print(f"\n{name}: another holder got it {waited:.3f} s after the {attempt} attempt")
        assert got, f"the {attempt} attempt's names stayed held by nobody"
        assert waited < 2 * LATE
        other.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["aio-lock", "aio-multilock"])
def test_give_back_follows_a_cancelled_attempt_after_the_loop_closed(
    make_server: Callable[..., RedisServer], prefix: str, kind: str
) -> None:
    """As above, for an acquire still out when `asyncio.run()` ends: the runner cancels its
    task, then closes the loop, while the request is still held back."""
    make_aio, make_other = KINDS[kind]
    server = make_server()
    names = [f"closed-loop-cancelled-{kind}-a", f"closed-loop-cancelled-{kind}-b"]
    with FaultProxy(server.port) as proxy:
        c = redmutex.Client(proxy.url, prefix=prefix, connect_timeout=1.0, command_timeout=5.0)
        other_client = redmutex.Client(server.url, prefix=prefix)
        sent: list[float] = []
        kept: list[asyncio.Task[bool]] = []

        async def main() -> None:
            warm = make_aio(c, names)
            assert await warm.acquire(timeout=0)
            await warm.release()
            loop_calls = _aio_calls()[0]
            hold = make_aio(c, names)
            proxy.set_latency(HELD, "c2s")
            sent.append(time.monotonic())
            kept.append(asyncio.ensure_future(hold.acquire(timeout=0)))
            await asyncio.sleep(0.05)
            assert _aio_calls()[0] == loop_calls + 1, "not sent on the loop's connection"
            # Only that request is held back: a give-back sent from now on is not.
            proxy.set_latency(0.0, "c2s")
            # Returns with the acquire still out: the runner cancels it, then closes the loop.

        try:
            asyncio.run(main())
            returned = time.monotonic() - sent[0]
            assert kept[0].cancelled()
            assert returned < HELD - 0.3, f"asyncio.run() returned after {returned:.3f} s"
            names_come_free(sent[0], names, kind, make_other, other_client, "cancelled")
        finally:
            c.close()
            other_client.close()
