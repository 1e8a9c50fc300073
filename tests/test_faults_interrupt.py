"""Ctrl-C while a blocking call waits on a server that does not answer.

The blocking API's one-round-trip calls (an acquire's first attempt, release, extend, owned, the
look-ups) go on a direct connection of the caller's thread. A signal must reach Python within a
fraction of a second there too, not after `command_timeout`. An acquire interrupted after it
was sent may still run on the server: it is given back once the server answers it, so no lock
stays held by a token nobody knows (not even until its ttl).

The server is our own, paused with SIGSTOP (and always SIGCONTinued in a `finally`); the
interrupt comes from a timer thread, as a real SIGINT to this process or as
`_thread.interrupt_main()`.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redmutex
from _helpers import Paused, wait_until
from redmutex._server import RedisServer

# Far longer than an interrupt may take to land, so that the two cannot be confused.
COMMAND_TIMEOUT = 5.0
INTERRUPT_AFTER = 0.3
# How soon after the signal the call must have ended, on a loaded 2-core machine.
LANDS_WITHIN = 1.5
TTL = 30.0


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)


INTERRUPTS: dict[str, Callable[[], None]] = {
    "sigint": _sigint,
    "interrupt_main": _thread.interrupt_main,
}


def _interrupted(call: Callable[[], object], interrupt: Callable[[], None]) -> tuple[str, float]:
    """Runs `call` while a timer interrupts the main thread after INTERRUPT_AFTER: what it ended
    with ("interrupt", or the repr of its result or other exception) and when, counted from the
    interrupt. An interrupt that comes late (after `call` ended) is swallowed here.
    Python's own SIGINT handler is installed for the while: a process started in the
    background by a shell inherits SIGINT ignored, and Python then installs none."""
    timer = threading.Timer(INTERRUPT_AFTER, interrupt)
    outcome = "not ended"
    took = float("inf")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t0 = time.monotonic()
        timer.start()
        try:
            outcome = repr(call())
        except KeyboardInterrupt:
            outcome = "interrupt"
        except Exception as exc:  # noqa: BLE001 - compared in the assertion
            outcome = repr(exc)
        took = time.monotonic() - t0 - INTERRUPT_AFTER
        timer.join()
        for _ in range(20):  # a late interrupt is raised here, not in pytest
            time.sleep(0.01)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return outcome, took


@pytest.fixture
def server(make_server: Callable[..., RedisServer]) -> RedisServer:
    return make_server()


@pytest.fixture
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        yield c
    finally:
        c.close()


def _client(server: RedisServer, prefix: str) -> redmutex.Client:
    return redmutex.Client(server.url, prefix=prefix, command_timeout=COMMAND_TIMEOUT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", sorted(INTERRUPTS))
def test_interrupted_first_acquire_lands_at_once_and_is_given_back(
    server: RedisServer, conn: redis.Redis, prefix: str, how: str
) -> None:
    key = f"{prefix}{{intr}}:lock".encode()
    c = _client(server, prefix)
    try:
        lock = redmutex.Lock(c, "intr", ttl=TTL)
        # The direct connection is open already: the acquire itself is what goes unanswered.
        assert lock.locked() is False
        with Paused(server) as paused:
            outcome, took = _interrupted(lambda: lock.acquire(timeout=10), INTERRUPTS[how])
            paused.resume()
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
        assert lock.token is None
        # The server ran the acquire once resumed; it is given back long before the ttl.
        wait_until(lambda: not conn.exists(key), 10, "the interrupted acquire to be given back")
        other = redmutex.Lock(c, "intr", ttl=TTL)
        assert other.acquire(timeout=5) is True
        other.release()
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_interrupted_acquire_lock_is_given_back(
    server: RedisServer, conn: redis.Redis, prefix: str
) -> None:
    """The recipe without an identifier: the one it drew is nobody else's, so once the server
    answers the interrupted acquire it is given back, long before `ltime` (with an identifier
    of the caller's it would be left to lapse: another call may hold the lock with it)."""
    key = f"{prefix}{{intr-recipe}}:lock".encode()
    c = _client(server, prefix)
    try:
        assert redmutex.acquire_lock(c, "intr-recipe", "warm") == "warm"  # the path is open
        assert redmutex.release_lock(c, "intr-recipe", "warm")
        with Paused(server) as paused:
            call = lambda: redmutex.acquire_lock(c, "intr-recipe", atime=10, ltime=TTL)
            outcome, took = _interrupted(call, _sigint)
            paused.resume()
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
        wait_until(lambda: not conn.exists(key), 10, "the interrupted acquire to be given back")
    finally:
        c.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["semaphore", "rwlock-write"])
def test_interrupted_first_acquire_of_other_primitives_is_given_back(
    server: RedisServer, prefix: str, kind: str
) -> None:
    """The same for the other primitives (one hold serves them all): once the server answers
    the interrupted acquire, another client takes the one place long before the ttl ends."""
    c = _client(server, prefix)
    c2 = _client(server, prefix)

    def make(client: redmutex.Client) -> redmutex.Semaphore | redmutex.RWLockSide:
        if kind == "semaphore":
            return redmutex.Semaphore(client, "intr-p", 1, ttl=TTL)
        return redmutex.RWLock(client, "intr-p", ttl=TTL).write()

    try:
        held = make(c)
        assert held.acquire(timeout=5) is True  # the direct connection is open
        held.release()
        with Paused(server) as paused:
            outcome, took = _interrupted(lambda: held.acquire(timeout=10), _sigint)
            paused.resume()
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
        other = make(c2)
        assert other.acquire(timeout=10) is True
        other.release()
    finally:
        c2.close()
        c.close()


@pytest.mark.timeout(60)
def test_interrupted_first_call_of_a_client_lands_at_once(server: RedisServer, prefix: str) -> None:
    """The direct connection opens on the paused server (the kernel accepts it): its handshake
    goes unanswered, and nothing was sent that could take the lock."""
    c = _client(server, prefix)
    try:
        lock = redmutex.Lock(c, "cold", ttl=TTL)
        with Paused(server):
            outcome, took = _interrupted(lambda: lock.acquire(timeout=10), _sigint)
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
        assert lock.acquire(timeout=5) is True
        lock.release()
    finally:
        c.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", ["locked", "owned", "extend", "release"])
def test_interrupted_one_round_trip_call_lands_at_once(
    server: RedisServer, prefix: str, call: str
) -> None:
    c = _client(server, prefix)
    try:
        lock = redmutex.Lock(c, "intr1", ttl=TTL)
        assert lock.acquire(timeout=5) is True
        with Paused(server):
            outcome, took = _interrupted(getattr(lock, call), _sigint)
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
    finally:
        c.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", sorted(INTERRUPTS))
def test_interrupted_wait_for_a_restarting_server_lands_at_once(
    server: RedisServer, prefix: str, how: str
) -> None:
    """A server that refuses connects (stopped: it may be restarting) is waited out for
    `connect_timeout` on the caller's thread: Ctrl-C ends that wait at once, not after it."""
    c = redmutex.Client(
        server.url, prefix=prefix, connect_timeout=COMMAND_TIMEOUT, command_timeout=COMMAND_TIMEOUT
    )
    try:
        lock = redmutex.Lock(c, "down", ttl=TTL)
        assert lock.acquire(timeout=5) is True
        lock.release()
        server.stop()
        outcome, took = _interrupted(lambda: lock.acquire(timeout=10), INTERRUPTS[how])
        assert outcome == "interrupt", (outcome, took)
        assert took < LANDS_WITHIN, took
    finally:
        c.close()
