"""A fill that outlives its claim's lease says so: a WARNING, not the INFO line of an entry that
was invalidated meanwhile.

A `lock_ttl` of a few ms is too short for the claim's renewal (every third of it) to reach Redis
in time: the claim lapses while the fill runs, another caller may take it and fill too, and the
value is not stored. The contract promises exactly one fill, which only a lease that renewal can
keep up with delivers; when it could not, the caller is told on the ``redmutex`` logger.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

import pytest
import redis
import redmutex
from _scale_servers import Masters
from redmutex import _core, aio

pytestmark = pytest.mark.timeout(60)

# A lease renewal cannot keep (its first renewal is due after 0.67 ms), and a fill far longer.
TINY_LEASE = 0.002
FILL_SECONDS = 0.1


def value_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:value"


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "redmutex" and r.levelno == level]


def slow_fill() -> str:
    time.sleep(FILL_SECONDS)
    return "filled"


def assert_lapse_warned(caplog: pytest.LogCaptureFixture, key: str) -> None:
    warnings = [r.getMessage() for r in records(caplog, logging.WARNING)]
    assert len(warnings) == 1, warnings
    assert repr(key) in warnings[0] and "lock_ttl" in warnings[0], warnings[0]


def test_a_fill_that_outlived_its_claim_warns(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="redmutex"):
        got = redmutex.get_or_fill(client, "lapse", slow_fill, ttl=30, lock_ttl=TINY_LEASE)
    assert got == "filled"  # the caller still gets its value...
    assert not r.exists(value_key(prefix, "lapse"))  # ...which was not stored
    assert_lapse_warned(caplog, "lapse")


def test_an_invalidated_fill_is_only_an_info(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Control: the claim ended because the entry was dropped, not because its lease ran out.
    filling, go_on = threading.Event(), threading.Event()
    got: list[str] = []

    def fill() -> str:
        filling.set()
        go_on.wait(10)
        return "old"

    def call() -> None:
        got.append(redmutex.get_or_fill(client, "inv", fill, ttl=30, lock_ttl=5))

    with caplog.at_level(logging.INFO, logger="redmutex"):
        t = threading.Thread(target=call, daemon=True)
        t.start()
        assert filling.wait(10)
        assert _core.CacheStore(client, ttl=30).invalidate("inv") is False
        go_on.set()
        t.join(10)
    assert got == ["old"]
    assert not r.exists(value_key(prefix, "inv"))
    assert records(caplog, logging.WARNING) == []
    assert len(records(caplog, logging.INFO)) == 1


def test_an_async_fill_that_outlived_its_claim_warns(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def fill() -> str:
        await asyncio.sleep(FILL_SECONDS)
        return "filled"

    with caplog.at_level(logging.INFO, logger="redmutex"):
        got = asyncio.run(aio.get_or_fill(client, "alapse", fill, ttl=30, lock_ttl=TINY_LEASE))
    assert got == "filled"
    assert not r.exists(value_key(prefix, "alapse"))
    assert_lapse_warned(caplog, "alapse")


def test_a_redlock_fill_that_outlived_its_claim_warns(caplog: pytest.LogCaptureFixture) -> None:
    # A Redlock lease is at least 10 ms, which renewal keeps up with: the masters stop serving
    # clients (CLIENT PAUSE) for longer than the lease while the fill runs, so it lapses.
    name = f"lapse-{uuid.uuid4().hex[:8]}"
    with Masters(3) as masters, redmutex.Client(masters.urls, prefix="t:") as client:

        def fill() -> str:
            for i in range(3):
                masters.conn(i).execute_command("CLIENT", "PAUSE", "200", "ALL")
            time.sleep(0.3)
            return "filled"

        with caplog.at_level(logging.INFO, logger="redmutex"):
            got = redmutex.get_or_fill(client, name, fill, ttl=30, lock_ttl=0.05)
        assert got == "filled"
        # Not stored on a majority (a master that still had the claim may keep a copy, which
        # is never served on its own).
        copies = sum(masters.conn(i).exists(value_key("t:", name)) for i in range(3))
        assert copies <= 1
    assert_lapse_warned(caplog, name)
