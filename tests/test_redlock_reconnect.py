"""Redlock when the masters close the client's connections: idle connections closed by the
servers (`timeout 1`, a common production setting) or killed (`CLIENT KILL`), and a store the
masters refuse (a value over `proto-max-bulk-len`, which also closes the connection)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from _proxy import FaultProxy
from _scale_servers import Masters
from redmutex import aio

pytestmark = pytest.mark.timeout(120)

# Longer than the masters' `timeout 1` plus their once-a-second sweep of idle clients.
IDLE = 2.5


def name() -> str:
    return "rlr-" + uuid.uuid4().hex[:12]


@pytest.fixture
def idle_closing() -> Iterator[Masters]:
    """Three masters that close a client's connection after 1 s without a command."""
    with Masters(3, extra_args=["--timeout", "1"]) as m:
        yield m


@pytest.fixture
def masters() -> Iterator[Masters]:
    with Masters(3) as m:
        yield m


def kill_clients(masters: Masters) -> None:
    """Every master closes every normal client connection (ours; not the subscribers)."""
    for i in range(len(masters.servers)):
        with masters.conn(i) as r:
            r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    time.sleep(0.1)  # the client has seen its connections end


def on_each(masters: Masters, op: Callable[[redis.Redis], object]) -> list[object]:
    """`op` on a connection of our own to each master, in order."""
    found = []
    for i in range(len(masters.servers)):
        with masters.conn(i) as r:
            found.append(op(r))
    return found


def lock_once(c: redmutex.Client) -> bool:
    lock = redmutex.Lock(c, name(), ttl=5)
    got = lock.acquire(timeout=1)
    lock.release()
    return got


def test_idle_connections_the_masters_closed_are_opened_again(idle_closing: Masters) -> None:
    """After the masters closed the idle connections, the first acquire and the first cache
    lookup succeed (the votes go out on fresh connections), as on a single server."""
    with redmutex.Client(idle_closing.urls) as c:
        assert lock_once(c)
        assert redmutex.get_or_fill(c, name(), lambda: "warm", ttl=30) == "warm"
        time.sleep(IDLE)
        assert lock_once(c)
        time.sleep(IDLE)
        assert redmutex.get_or_fill(c, name(), lambda: "v", ttl=30) == "v"


def test_idle_connections_the_masters_closed_are_opened_again_asyncio(
    idle_closing: Masters,
) -> None:
    async def fill() -> str:
        return "v"

    async def main(c: redmutex.Client) -> None:
        assert await aio.get_or_fill(c, name(), fill, ttl=30) == "v"
        await asyncio.sleep(IDLE)
        lock = aio.Lock(c, name(), ttl=5)
        assert await lock.acquire(timeout=1)
        await lock.release()
        await asyncio.sleep(IDLE)
        assert await aio.get_or_fill(c, name(), fill, ttl=30) == "v"

    with redmutex.Client(idle_closing.urls) as c:
        asyncio.run(main(c))


def _semaphore(c: redmutex.Client) -> bool:
    sem = redmutex.Semaphore(c, name(), 2, ttl=5)
    got = sem.acquire(timeout=1)
    sem.release()
    return got


def _rw(side: str) -> Callable[[redmutex.Client], bool]:
    def run(c: redmutex.Client) -> bool:
        rw = redmutex.RWLock(c, name(), ttl=5)
        held = rw.read() if side == "read" else rw.write()
        got = held.acquire(timeout=1)
        held.release()
        return got

    return run


def _recipe(c: redmutex.Client) -> bool:
    """A token the caller chose: the resent vote is a first send again."""
    lockname = name()
    identifier = redmutex.acquire_lock(c, lockname, uuid.uuid4().hex, atime=1, ltime=5)
    return bool(identifier) and redmutex.release_lock(c, lockname, identifier)


KINDS: dict[str, Callable[[redmutex.Client], object]] = {
    "recipe": _recipe,
    "lock": lock_once,
    "cache": lambda c: redmutex.get_or_fill(c, name(), lambda: True, ttl=30),
    "semaphore": _semaphore,
    "read": _rw("read"),
    "write": _rw("write"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_killed_connections_are_opened_again_by_the_next_vote(masters: Masters, kind: str) -> None:
    """CLIENT KILL on every master: the next quorum acquire of every primitive succeeds."""
    run = KINDS[kind]
    with redmutex.Client(masters.urls) as c:
        assert run(c)
        for _ in range(2):
            kill_clients(masters)
            assert run(c)


# How long a vote or release still out when the call returned may take to land (loopback; they
# land within a fraction of a second even on a loaded machine).
LANDS_WITHIN = 5.0


def settle(
    masters: Masters,
    read: Callable[[redis.Redis], object],
    want: object,
    allowed: set[object],
) -> None:
    """Reads every master until each shows `want`: what a won round's votes still out and a
    release's sends still out (both go on in the background) leave once they landed. Every read on
    the way may show only `allowed` values (anything else is a copy nobody should have)."""
    deadline = time.monotonic() + LANDS_WITHIN
    while True:
        found = on_each(masters, read)
        assert set(found) <= allowed, found
        if found == [want] * len(found):
            return
        assert time.monotonic() < deadline, f"the masters never settled at {want!r}: {found}"
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["lock", "cache"])
def test_a_vote_whose_reply_was_lost_is_resent_and_finds_its_own_grant(
    masters: Masters, kind: str
) -> None:
    """The vote ran on two masters of three but the connection broke before the reply: the
    resend finds this call's own token in place, which counts as its grant (a drawn token is
    nobody else's), and the release leaves nothing behind.

    The call returns once a majority answered; the vote (or the release) of the third master
    may still be on its way then and lands in the background (docs/scale-out.md): what a
    majority must show is checked as the call returns, what every master must show once it
    landed (bounded)."""
    proxies = [FaultProxy(s.port).start() for s in masters.servers]
    try:
        with redmutex.Client([p.url for p in proxies]) as c:
            assert KINDS[kind](c)  # scripts loaded, connections open
            n = name()
            for p in proxies[:2]:
                p.drop_reply_to(f"{{{n}}}".encode())
            if kind == "lock":
                lock = redmutex.Lock(c, n, ttl=10)
                # Won only if both resends count the token they find as this call's grant:
                # otherwise master 2 alone grants.
                assert lock.acquire(blocking=False)
                key = f"redmutex:{{{n}}}:lock"
                assert lock.token is not None
                token = lock.token.encode()
                copies = on_each(masters, lambda r: r.get(key))
                assert copies.count(token) >= 2 and set(copies) <= {token, None}, copies
                assert all(p.reply_dropped.wait(LANDS_WITHIN) for p in proxies[:2])
                settle(masters, lambda r: r.get(key), token, {token, None})
                lock.release()
                left = on_each(masters, lambda r: r.exists(key))
                assert left.count(0) >= 2, left
                settle(masters, lambda r: r.exists(key), 0, {0, 1})
            else:
                assert redmutex.get_or_fill(c, n, lambda: "v", ttl=30) == "v"
                key = f"redmutex:{{{n}}}:fill"
                left = on_each(masters, lambda r: r.exists(key))
                assert left.count(0) >= 2, left
                assert all(p.reply_dropped.wait(LANDS_WITHIN) for p in proxies[:2])
                settle(masters, lambda r: r.exists(key), 0, {0, 1})
            # Nothing comes back: a resent vote that landed after the release would set it again.
            time.sleep(0.1)
            assert on_each(masters, lambda r: r.exists(key)) == [0, 0, 0]
    finally:
        for p in proxies:
            p.stop()


def test_a_store_the_masters_refuse_gives_the_claim_back_at_once() -> None:
    """The filled value is larger than the masters take (`proto-max-bulk-len`): its filler still
    gets it, and the claim is given back at once (as on one server), so a waiter takes the fill
    over long before the claim's lease would have ended."""
    lock_ttl = 10.0
    huge = 2 * 1024 * 1024
    with Masters(3, extra_args=["--proto-max-bulk-len", "1mb"]) as masters:
        key = name()
        filling = threading.Event()
        waited: dict[str, object] = {}

        def fill_huge() -> bytes:
            filling.set()  # the claim is ours on a majority: the waiter waits for it
            time.sleep(0.3)
            return b"x" * huge

        def waiter() -> None:
            assert filling.wait(10)
            with redmutex.Client(masters.urls) as other:
                started = time.monotonic()
                waited["value"] = redmutex.get_or_fill(
                    other, key, lambda: "small", ttl=30, lock_ttl=lock_ttl, timeout=30
                )
                waited["took"] = time.monotonic() - started

        thread = threading.Thread(target=waiter)
        thread.start()
        with redmutex.Client(masters.urls) as c:
            got = redmutex.get_or_fill(c, key, fill_huge, ttl=30, lock_ttl=lock_ttl)
            assert got == b"x" * huge
        thread.join(40)
        assert waited.get("value") == "small"
        took = waited["took"]
        assert isinstance(took, float)
        assert took < lock_ttl / 3, f"the waiter took the fill over after {took:.2f} s"
