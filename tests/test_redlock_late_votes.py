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


def test_an_extend_decided_without_a_slow_master_still_reaches_it(masters: Masters) -> None:
    """An extend is decided by the first majority, but the masters that answer later must get it
    too: otherwise their copy runs out with the old lease, and the hold then stands on a bare
    majority that one more master's failure ends."""
    client = redmutex.Client(masters.urls, prefix="t:", connect_timeout=1, command_timeout=1)
    assert client.ping()
    warm = redmutex.Lock(client, name(), ttl=60)
    assert warm.acquire(blocking=False)
    short: list[str] = []
    rounds = 3
    for _ in range(rounds):
        lock_name = name()
        lock = redmutex.Lock(client, lock_name, ttl=3)
        slow_acquire_votes(masters, warm)
        assert lock.acquire(blocking=False)
        lock.extend(60)
        time.sleep(1.0)  # the slow masters answered long ago
        for i in range(len(masters.urls)):
            with masters.conn(i) as r:
                pttl = r.pttl("t:{" + lock_name + "}:lock")
            if pttl < 30_000:
                short.append(f"master {i}: {pttl} ms")
        lock.release()
    warm.release()
    assert not short, f"extend(60) missed a master in {rounds} rounds: {short}"
