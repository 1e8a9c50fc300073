"""Redlock: what a hold asks right after its acquire (`owned`, `extend`, `locked`) must not
overtake the acquire's own votes still out on a slow master. With a minority of masters silent,
such a check was undecided (QuorumError) although this client's hold had a majority."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
import redmutex
from _scale_servers import Masters

pytestmark = pytest.mark.timeout(120)

SLOW = (3, 4)  # the masters whose acquire votes come late
STOPPED = 0  # a granting master, stopped right after the acquire


@pytest.fixture
def masters() -> Iterator[Masters]:
    with Masters(5) as m:
        yield m


def name() -> str:
    return "rlv-" + uuid.uuid4().hex[:12]


def slow_acquire_votes(masters: Masters, warm: redmutex.Lock) -> None:
    """The acquire script is missing on the SLOW masters (its vote there goes EVALSHA, NOSCRIPT,
    SCRIPT LOAD, EVALSHA), while `warm`'s extend and ownership scripts are loaded again; those
    masters also hold every command back for a moment, so the round is won without them."""
    for i in SLOW:
        with masters.conn(i) as r:
            r.script_flush()
    assert warm.extend() is None and warm.owned()  # loads those scripts again everywhere
    for i in SLOW:
        with masters.conn(i) as r:
            r.execute_command("CLIENT", "PAUSE", 150, "ALL")


@pytest.mark.parametrize("ask", ["owned", "extend", "locked"])
def test_a_check_right_after_acquire_waits_for_the_late_votes(masters: Masters, ask: str) -> None:
    client = redmutex.Client(masters.urls, prefix="t:", connect_timeout=1, command_timeout=1)
    assert client.ping()
    warm = redmutex.Lock(client, name(), ttl=60)
    assert warm.acquire(blocking=False)
    stopped = masters.servers[STOPPED].process
    assert stopped is not None
    failures: list[str] = []
    rounds = 4
    for _ in range(rounds):
        lock = redmutex.Lock(client, name(), ttl=30)
        slow_acquire_votes(masters, warm)
        assert lock.acquire(blocking=False)
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            if ask == "extend":
                lock.extend(30)
                answer: object = lock.remaining() is not None and not lock.lost
            else:
                answer = getattr(lock, ask)()
        except redmutex.QuorumError as err:
            answer = err
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        if answer is not True:
            failures.append(repr(answer))
        time.sleep(0.2)  # the pause is over
        lock.release()
    warm.release()
    assert not failures, f"{ask}() after a won round, {len(failures)} of {rounds}: {failures}"
