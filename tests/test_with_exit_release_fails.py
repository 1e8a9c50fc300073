"""Leaving a `with` block whose release fails (Redis paused past the command timeout): the exit
raises ConnectionError, and the object holds nothing from then on. A block's exit cannot be
retried, so the release goes on in the background (until the lease would end) and the object can
enter a block again. It stayed "held" for good before: every later `with` raised LockError
("already holds"), `token` kept a hold Redis no longer had.

Each test starts its own redis-server (a paused server would stall other tests) and stops it by
its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(60)

PAUSE_MS = 800  # the release's command timeout is 0.3 s: it times out while writes are paused


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    try:
        yield s
    finally:
        s.close()


def _pause_writes(server: RedisServer) -> None:
    with redis.Redis(port=server.port) as admin:
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")


def _keys(server: RedisServer, name: str) -> set[bytes]:
    with redis.Redis(port=server.port) as r:
        return set(r.scan_iter(match=f"redmutex:{{{name}}}:*")) - {
            f"redmutex:{{{name}}}:fence".encode()
        }


def _wait_released(server: RedisServer, name: str) -> float:
    """Seconds until nothing but the fence is left of `name` (the background release), at
    most 10 (the lease is 30 s: its end would not free it by then)."""
    start = time.monotonic()
    while _keys(server, name):
        assert time.monotonic() - start < 10, f"{name} still held: {_keys(server, name)}"
        time.sleep(0.05)
    return time.monotonic() - start


def _client(server: RedisServer) -> redmutex.Client:
    return redmutex.Client(server.url, command_timeout=0.3)


Maker = Callable[[redmutex.Client, str], Any]

MAKERS: dict[str, Maker] = {
    "lock": lambda c, n: redmutex.Lock(c, n, ttl=30),
    "fair lock": lambda c, n: redmutex.Lock(c, n, ttl=30, fair=True),
    "auto-renewed lock": lambda c, n: redmutex.Lock(c, n, ttl=30, auto_renew=True),
    "semaphore": lambda c, n: redmutex.Semaphore(c, n, 2, ttl=30),
    "rwlock write": lambda c, n: redmutex.RWLock(c, n, ttl=30).write(),
    "rwlock read": lambda c, n: redmutex.RWLock(c, n, ttl=30).read(),
    "multilock": lambda c, n: redmutex.MultiLock(c, [n, n + "-b"], ttl=30),
}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_block_whose_release_failed_holds_nothing_after(server: RedisServer, kind: str) -> None:
    client = _client(server)
    name = f"exit-{kind.replace(' ', '-')}"
    held = MAKERS[kind](client, name)
    try:
        with pytest.raises(redmutex.ConnectionError), held:
            _pause_writes(server)
        assert getattr(held, "token", None) is None
        _wait_released(server, name)
        with held:  # refused "already holds" before
            assert held.owned()
        assert getattr(held, "token", None) is None
    finally:
        client.close()


def test_a_block_that_raised_and_whose_release_failed_logs_and_holds_nothing_after(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client(server)
    lock = redmutex.Lock(client, "exit-raised", ttl=30)
    try:
        with pytest.raises(KeyError), lock:
            _pause_writes(server)
            raise KeyError("the block's own")
        assert lock.token is None
        assert "on leaving a block that raised" in caplog.text
        _wait_released(server, "exit-raised")
        assert lock.acquire(timeout=5)
        lock.release()
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["lock", "semaphore", "rwlock write"])
def test_an_async_block_whose_release_failed_holds_nothing_after(
    server: RedisServer, kind: str
) -> None:
    makers: dict[str, Maker] = {
        "lock": lambda c, n: aio.Lock(c, n, ttl=30),
        "semaphore": lambda c, n: aio.Semaphore(c, n, 2, ttl=30),
        "rwlock write": lambda c, n: aio.RWLock(c, n, ttl=30).write(),
    }
    client = _client(server)
    name = f"aexit-{kind.replace(' ', '-')}"

    async def main() -> None:
        held = makers[kind](client, name)
        with pytest.raises(redmutex.ConnectionError):
            async with held:
                await asyncio.to_thread(_pause_writes, server)
        assert getattr(held, "token", None) is None
        await asyncio.to_thread(_wait_released, server, name)
        async with held:
            assert await held.owned()

    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(Exception):
            client.close()


def test_a_loss_found_before_the_failed_exit_stays_reported(server: RedisServer) -> None:
    # Renewal finds the lease lost while the block runs (writes paused past the 1 s lease);
    # the exit's release then fails too. The object holds nothing after, and `lost` stays True
    # (giving the hold back reset it).
    client = _client(server)
    lock = redmutex.Lock(client, "exit-lost", ttl=1, auto_renew=True)
    try:
        with pytest.raises(redmutex.LockError), lock:
            with redis.Redis(port=server.port) as admin:
                admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
            deadline = time.monotonic() + 5
            while not lock.lost:
                assert time.monotonic() < deadline, "renewal never found the loss"
                time.sleep(0.05)
        assert lock.lost and lock.token is None
    finally:
        client.close()


def test_an_extend_after_a_failed_release_still_reports_a_real_loss(server: RedisServer) -> None:
    # A plain release() that raised keeps the hold for a retry; if another owner takes the name
    # meanwhile, an extend says the lock was lost (it said "not owned" while `token` was set).
    client = _client(server)
    lock = redmutex.Lock(client, "released-then-taken", ttl=30)
    other = redmutex.Lock(client, "released-then-taken", ttl=30)
    try:
        assert lock.acquire(timeout=5)
        _pause_writes(server)
        with pytest.raises(redmutex.ConnectionError):
            lock.release()
        assert lock.token is not None
        time.sleep(PAUSE_MS / 1000 + 0.2)
        with redis.Redis(port=server.port) as r:  # the lease lapses (as if it had run out)
            r.delete("redmutex:{released-then-taken}:lock")
        assert other.acquire(timeout=5)
        with pytest.raises(redmutex.LockLostError):
            lock.extend()
        assert lock.lost
        other.release()
    finally:
        client.close()


def test_an_exit_interrupted_by_ctrl_c_holds_nothing_after(server: RedisServer) -> None:
    # Ctrl-C while the exit's release waits for a paused server: the KeyboardInterrupt goes
    # on, and the object holds nothing (it kept the hold: every later `with` was refused).
    client = redmutex.Client(server.url, command_timeout=5)
    lock = redmutex.Lock(client, "exit-ctrl-c", ttl=30)
    interrupt = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt), lock:
            _pause_writes(server)
            interrupt.start()
        assert lock.token is None
        _wait_released(server, "exit-ctrl-c")
        with lock:
            assert lock.owned()
    finally:
        interrupt.cancel()
        client.close()
