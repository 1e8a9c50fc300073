"""Issue 18 item 5: a blocking waiter of an unfair lock on one server listens for its wake-ups on
its own thread's subscriber connection (`engine/listener.rs`) instead of through the hub, whose
runtime thread would read the message and then wake the caller (two thread wake-ups per hand-off
instead of one).

The listener keeps its channels for a while after its wait ends (the next wait on the name then
subscribes nothing), then gives them up: a connection that nobody reads never keeps a
subscription, whose messages would pile up until Redis drops it at its output-buffer limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
import redmutex
from _helpers import ResultThread as _Thread
from _helpers import wait_until as _wait_until

KeyOf = Callable[[str, str], bytes]


def _subscribed(r: redis.Redis, pattern: bytes) -> list[bytes]:
    return sorted(r.pubsub_channels(pattern))


@pytest.mark.timeout(60)
def test_a_blocking_waiter_is_granted_and_its_channels_lapse_after_the_wait(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    name = "own-listener"
    wake = key_of(name, "wake")
    holder = redmutex.Lock(client, name, ttl=10)
    waiter = redmutex.Lock(other_client, name, ttl=10)
    assert holder.acquire(timeout=0)
    waiting = _Thread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    # The waiter listens on the wake channel and its process's inbox (`wake:<inbox>`).
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to subscribe")
    time.sleep(0.2)  # it has looked, and reads its connection now
    holder.release()
    assert waiting.outcome(10) is True
    # Granted by the release: the lock is the waiter's, nobody else's.
    assert r.get(key_of(name, "lock")) == waiter.token.encode()
    waiter.release()
    # Idle, the listener gives its channels up (after about a second; bound generous).
    _wait_until(lambda: _subscribed(r, wake + b"*") == [], 15, "the idle listener to unsubscribe")
    # And a later wait listens again.
    assert holder.acquire(timeout=0)
    waiting = _Thread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to subscribe")
    time.sleep(0.2)
    holder.release()
    assert waiting.outcome(10) is True
    waiter.release()


@pytest.mark.timeout(60)
def test_a_waiter_whose_connection_is_killed_listens_again_and_is_granted(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, key_of: KeyOf
) -> None:
    name = "own-listener-killed"
    wake = key_of(name, "wake")
    holder = redmutex.Lock(client, name, ttl=10)
    waiter = redmutex.Lock(other_client, name, ttl=10)
    assert holder.acquire(timeout=0)
    waiting = _Thread(lambda: waiter.acquire(timeout=20))
    waiting.start()
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to subscribe")
    time.sleep(0.2)
    assert r.client_kill_filter(_type="pubsub") >= 1
    # It looks again on a new connection, subscribed before that look.
    _wait_until(lambda: len(_subscribed(r, wake + b"*")) == 2, 10, "the waiter to listen again")
    t0 = time.monotonic()
    holder.release()
    assert waiting.outcome(10) is True
    # Woken by the release, not by the holder's lease (10 s) ending.
    assert time.monotonic() - t0 < 5
    waiter.release()
