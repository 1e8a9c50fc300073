"""A cache lookup held up past the command timeout, run by Redis after its give-back.

`get_or_fill`'s first lookup reads the value and, on a miss, claims the fill in one script. Here
the network holds that request back (1 s on its way to Redis, FaultProxy) while the command
timeout is 0.3 s: the caller raises ConnectionError and the claim the lookup may take is given
back in the background, before the lookup has run. Then it runs and takes the claim. Unless the
give-back is sent again once the held-up call has been answered, nobody owns that claim and
every other caller waits for the rest of its lease (`lock_ttl`, 10 s here).

Every redis-server here is started by the test and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redmutex
from _proxy import FaultProxy
from _scale_servers import Masters
from redmutex import aio
from redmutex._core import CacheStore, FillClaim
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(90)

LOCK_TTL = 10.0  # the lease of the orphaned claim: what another caller waited before the fix
LATE = 1.0  # how long the lookup is held back on its way to Redis
SOON = 3.0  # how long another caller may wait instead (generous: a noisy 2-core machine)


def refuse_to_fill() -> object:
    raise AssertionError("the caller whose lookup timed out must not fill")


async def refuse_to_fill_async() -> object:
    raise AssertionError("the caller whose lookup timed out must not fill")


def late_lookup(proxies: list[FaultProxy], look: Callable[[], object]) -> float:
    """Runs `look` (a get_or_fill through `proxies`) while its requests reach Redis `LATE` s
    late; it must raise ConnectionError (or QuorumError, a LockError too). Returns when it
    started."""
    for proxy in proxies:
        proxy.set_latency(LATE, "c2s")

    def fast_again() -> None:
        for proxy in proxies:
            proxy.set_latency(0.0, "c2s")

    # Only the lookup is held back: what is sent after 0.15 s (the give-back) goes at once.
    reset = threading.Timer(0.15, fast_again)
    reset.start()
    started = time.monotonic()
    try:
        with pytest.raises(redmutex.LockError) as raised:
            look()
    finally:
        reset.join()
    assert isinstance(raised.value, (redmutex.ConnectionError, redmutex.QuorumError))
    return started


def another_caller_fills(other: redmutex.Client, key: str, started: float) -> None:
    """Once the held-up lookup has run, another caller claims the fill at once (no orphan
    claim holds it for `LOCK_TTL`), and keeps it: the second give-back is token-checked."""
    time.sleep(max(0.0, started + LATE + 0.5 - time.monotonic()))
    store = CacheStore(other, ttl=30, lock_ttl=LOCK_TTL)
    looked_at = time.monotonic()
    found = store.fetch(key, timeout=SOON + 3)
    waited = time.monotonic() - looked_at
    print(f"\nanother caller waited {waited:.3f} s for the fill claim")
    assert isinstance(found, FillClaim), (
        f"another caller waited {waited:.1f} s in vain: an orphan claim held the entry"
    )
    assert waited < SOON, f"another caller waited {waited:.1f} s for an orphan claim"
    time.sleep(0.5)  # a give-back of the timed-out caller still under way would land now
    assert store.holds_claim(key, found.token), "a late give-back removed a later caller's claim"
    assert found.store(b"filled by another caller")


@pytest.fixture
def proxied(make_server: Callable[..., RedisServer]) -> Iterator[tuple[RedisServer, FaultProxy]]:
    server = make_server()
    with FaultProxy(server.port) as proxy:
        yield server, proxy


def clients(
    url: str | list[str], other_url: str | list[str]
) -> tuple[redmutex.Client, redmutex.Client]:
    """A client whose calls time out after 0.3 s (through the proxies), and another one."""
    faulty = redmutex.Client(url, prefix="late:", connect_timeout=1.0, command_timeout=0.3)
    other = redmutex.Client(other_url, prefix="late:")
    return faulty, other


def test_sync_lookup_that_ran_after_its_give_back(
    proxied: tuple[RedisServer, FaultProxy],
) -> None:
    """The blocking API: the first lookup goes on a direct connection of the caller's thread."""
    server, proxy = proxied
    faulty, other = clients(proxy.url, server.url)
    try:
        assert redmutex.get_or_fill(faulty, "warm", lambda: 1, ttl=30) == 1  # scripts loaded
        key = f"sync-{uuid.uuid4().hex[:8]}"
        started = late_lookup(
            [proxy],
            lambda: redmutex.get_or_fill(
                faulty, key, refuse_to_fill, ttl=30, lock_ttl=LOCK_TTL, timeout=0
            ),
        )
        another_caller_fills(other, key, started)
    finally:
        faulty.close()
        other.close()


def test_aio_lookup_that_ran_after_its_give_back(
    proxied: tuple[RedisServer, FaultProxy],
) -> None:
    """`redmutex.aio`: the lookup goes on the runtime's shared connection."""
    server, proxy = proxied
    faulty, other = clients(proxy.url, server.url)

    async def warm() -> None:
        async def one() -> int:
            return 1

        assert await aio.get_or_fill(faulty, "warm", one, ttl=30) == 1

    try:
        asyncio.run(warm())
        key = f"aio-{uuid.uuid4().hex[:8]}"
        started = late_lookup(
            [proxy],
            lambda: asyncio.run(
                aio.get_or_fill(
                    faulty, key, refuse_to_fill_async, ttl=30, lock_ttl=LOCK_TTL, timeout=0
                )
            ),
        )
        another_caller_fills(other, key, started)
    finally:
        faulty.close()
        other.close()


def test_redlock_lookup_that_ran_after_its_give_back() -> None:
    """Redlock: every master's vote (lookup and claim) is held back, so no majority answers in
    time (QuorumError); the round's give-backs wait for the votes that timed out, at most one
    command timeout, and are not sent. The votes then run and claim the entry on every master."""
    with Masters(3) as masters:
        proxies = [FaultProxy(s.port).start() for s in masters.servers]
        try:
            faulty, other = clients([p.url for p in proxies], masters.urls)
            try:
                assert redmutex.get_or_fill(faulty, "warm", lambda: 1, ttl=30) == 1
                key = f"redlock-{uuid.uuid4().hex[:8]}"
                started = late_lookup(
                    proxies,
                    lambda: redmutex.get_or_fill(
                        faulty, key, refuse_to_fill, ttl=30, lock_ttl=LOCK_TTL, timeout=0
                    ),
                )
                another_caller_fills(other, key, started)
            finally:
                faulty.close()
                other.close()
        finally:
            for proxy in proxies:
                proxy.stop()
