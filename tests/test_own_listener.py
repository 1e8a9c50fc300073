"""Issue 18 item 5: a blocking waiter of an unfair lock on one server listens for its wake-ups on
its own thread's subscriber connection (`engine/listener.rs`) instead of through the hub, whose
runtime thread would read the message and then wake the caller (two thread wake-ups per hand-off
instead of one).

The listener keeps its channels for a while after its wait ends (the next wait on the name then
subscribes nothing), then gives them up: a connection that nobody reads never keeps a
subscription, whose messages would pile up until Redis drops it at its output-buffer limit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import wait_until as _wait_until
from redmutex import _core
from redmutex._server import RedisServer

KeyOf = Callable[[str, str], bytes]


def _subscribed(r: redis.Redis, pattern: bytes) -> list[bytes]:
    return sorted(r.pubsub_channels(pattern))


def _listening_waiter(waiter: redmutex.Lock, r: redis.Redis, wake: bytes) -> _Thread:
    """`waiter.acquire(timeout=20)` in a thread, once it listens on the wake channel and its
    process's inbox (`wake:<inbox>`) and has looked (it reads its connection then)."""
    waiting = _Thread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to subscribe")
    time.sleep(0.2)
    return waiting


def _held_with_a_listening_waiter(
    clients: tuple[redmutex.Client, redmutex.Client], r: redis.Redis, key_of: KeyOf, name: str
) -> tuple[bytes, redmutex.Lock, redmutex.Lock, _Thread]:
    """`name` taken by a holder on the first client, and a waiter on the second that listens
    (`_listening_waiter`): the wake channel, the holder, the waiter and the waiting thread."""
    wake = key_of(name, "wake")
    holder = redmutex.Lock(clients[0], name, ttl=10)
    waiter = redmutex.Lock(clients[1], name, ttl=10)
    assert holder.acquire(timeout=0)
    return wake, holder, waiter, _listening_waiter(waiter, r, wake)


@pytest.mark.timeout(60)
def test_a_blocking_waiter_is_granted_and_its_channels_lapse_after_the_wait(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    name = "own-listener"
    wake, holder, waiter, waiting = _held_with_a_listening_waiter(
        (client, other_client), r, key_of, name
    )
    holder.release()
    assert waiting.outcome(10) is True
    # Granted by the release: the lock is the waiter's, nobody else's.
    assert r.get(key_of(name, "lock")) == waiter.token.encode()
    waiter.release()
    # Idle, the listener gives its channels up (after about a second; bound generous).
    _wait_until(lambda: _subscribed(r, wake + b"*") == [], 15, "the idle listener to unsubscribe")
    # And a later wait listens again.
    assert holder.acquire(timeout=0)
    waiting = _listening_waiter(waiter, r, wake)
    holder.release()
    assert waiting.outcome(10) is True
    waiter.release()


@pytest.mark.timeout(60)
def test_a_waiter_whose_connection_is_killed_listens_again_and_is_granted(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    name = "own-listener-killed"
    wake, holder, waiter, waiting = _held_with_a_listening_waiter(
        (client, other_client), r, key_of, name
    )
    assert r.client_kill_filter(_type="pubsub") >= 1
    # It looks again on a new connection, subscribed before that look.
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to listen again")
    # Released right after one of the waiter's looks (it refreshes its queue place every
    # ~0.67 s): the release's grant, heard, needs no further look; a lost wake-up would be
    # noticed only by the next refresh, one more look.
    looked = _after_a_look()
    holder.release()
    assert waiting.outcome(10) is True
    assert _core._waiting_attempts() == looked
    waiter.release()


def _after_a_look() -> int:
    """The count of waiting attempts once the next one has been made."""
    before = _core._waiting_attempts()
    _wait_until(lambda: _core._waiting_attempts() > before, 10, "the waiter's next look")
    return _core._waiting_attempts()


@pytest.mark.timeout(60)
def test_a_signal_handler_may_wait_on_another_lock_while_the_main_thread_waits(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    """Python runs signal handlers on the main thread while it waits in `acquire()`: a handler
    that waits on another lock of the same client runs outside the runtime (a nested blocking
    wait inside it would panic), and the outer wait goes on and is granted."""
    assert threading.current_thread() is threading.main_thread()
    holder = redmutex.Lock(other_client, "own-listener-sig", ttl=10)
    busy = redmutex.Lock(other_client, "own-listener-sig-busy", ttl=10)
    waiter = redmutex.Lock(client, "own-listener-sig", ttl=10)
    in_handler = redmutex.Lock(client, "own-listener-sig-busy", ttl=10)
    free = redmutex.Lock(client, "own-listener-sig-free", ttl=10)
    assert holder.acquire(timeout=0)
    assert busy.acquire(timeout=0)
    outcomes: list[object] = []

    def handler(signum: int, frame: object) -> None:
        try:
            # Waits (the lock is busy) and gives up; then takes and gives back a free one.
            outcomes.append(in_handler.acquire(timeout=0.3))
            outcomes.append(free.acquire(timeout=1))
            free.release()
        except BaseException as err:  # noqa: BLE001 - recorded for the assertion below
            outcomes.append(err)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        signaller = threading.Timer(0.4, os.kill, args=(os.getpid(), signal.SIGUSR1))
        releaser = threading.Timer(1.5, holder.release)
        signaller.start()
        releaser.start()
        assert waiter.acquire(timeout=20) is True
        signaller.join(5)
        releaser.join(5)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert outcomes == [False, True]
    waiter.release()
    busy.release()


@pytest.mark.timeout(60)
def test_ctrl_c_ends_a_wait_on_the_own_listener_promptly(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    holder = redmutex.Lock(other_client, "own-listener-ctrl-c", ttl=10)
    waiter = redmutex.Lock(client, "own-listener-ctrl-c", ttl=10)
    assert holder.acquire(timeout=0)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            waiter.acquire(timeout=30)
        elapsed = time.monotonic() - t0
        timer.join(5)
    finally:
        signal.signal(signal.SIGINT, old)
    assert elapsed < 3.0
    assert waiter.token is None
    holder.release()
    # The interrupted wait neither holds nor later takes the lock.
    assert waiter.acquire(timeout=5) is True
    waiter.release()


@pytest.mark.timeout(60)
def test_a_waiter_whose_listener_cannot_connect_waits_through_the_hub(
    make_server: Callable[..., RedisServer],
) -> None:
    """A server that refuses one more connection (maxclients, or the process's fd limit): the
    waiter cannot have a listener of its own, and waits through the hub (whose subscriber
    connection is made already) instead of failing."""
    server = make_server()
    admin = redis.Redis.from_url(server.url)
    client = redmutex.Client(server.url, prefix="maxc:")
    other = redmutex.Client(server.url, prefix="maxc:")
    try:
        holder = redmutex.Lock(other, "own-listener-maxclients", ttl=10)
        waiter = redmutex.Lock(client, "own-listener-maxclients", ttl=10)
        # Every connection the wait needs besides a listener: the hub's (a fair lock's wait is
        # served there), the waiter's and the holder's direct ones.
        fair_holder = redmutex.Lock(other, "maxc-fair", ttl=10, fair=True)
        fair_waiter = redmutex.Lock(client, "maxc-fair", ttl=10, fair=True)
        assert fair_holder.acquire(timeout=0)
        assert fair_waiter.acquire(timeout=0.2) is False
        fair_holder.release()
        assert holder.acquire(timeout=0)
        assert waiter.acquire(timeout=0) is False
        connected = int(admin.info("clients")["connected_clients"])
        admin.config_set("maxclients", connected)
        t0 = time.monotonic()
        released = threading.Timer(0.5, holder.release)
        released.start()
        assert waiter.acquire(timeout=20) is True
        released.join(5)
        # Woken by the release, not by the holder's lease (10 s) ending.
        assert time.monotonic() - t0 < 5
        waiter.release()
    finally:
        admin.config_set("maxclients", 10000)
        client.close()
        other.close()
        admin.close()
