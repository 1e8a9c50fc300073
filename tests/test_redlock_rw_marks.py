"""Redlock RWLock: a writer's waiting mark goes with its acquire. Contending writers that all
finished must leave no mark that holds new readers back: the leave used to overtake a vote of
the won round still out on a master (queued behind a give-back there), which then marked the
writer again for a whole place (6 s)."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
import redmutex
from _scale_servers import Masters

pytestmark = pytest.mark.timeout(120)


def live_marks(masters: Masters, key: str) -> list[list[int]]:
    """Per master, the ms left of each live waiting-writer mark."""
    out = []
    for i in range(len(masters.servers)):
        with masters.conn(i) as r:
            seconds, micros = r.time()
            now = seconds * 1000 + micros // 1000
            scores = [s for _, s in r.zrange(key, 0, -1, withscores=True)]
            out.append([int(s - now) for s in scores if s > now])
    return out


def test_contending_writers_leave_no_mark_behind() -> None:
    with Masters(3) as masters:
        failures = []
        runs = 3
        for run in range(runs):
            n = "rwm-" + uuid.uuid4().hex[:12]
            clients = [redmutex.Client(masters.urls, prefix="t:") for _ in range(4)]
            stop = time.monotonic() + 1.0

            def write(client: redmutex.Client, n: str, stop: float) -> None:
                rw = redmutex.RWLock(client, n, ttl=10)
                while time.monotonic() < stop:
                    side = rw.write()
                    if side.acquire(timeout=2):
                        time.sleep(random.random() * 0.005)
                        side.release()

            threads = [threading.Thread(target=write, args=(c, n, stop)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            # The leaves go in the background, each after its round's votes still out: allow
            # them 3 s to land (a left mark lives 6 s).
            key = f"t:{{{n}}}:rw:writers_waiting"
            until = time.monotonic() + 3
            while any(marks := live_marks(masters, key)) and time.monotonic() < until:
                time.sleep(0.05)
            reader = redmutex.RWLock(redmutex.Client(masters.urls, prefix="t:"), n).read()
            started = time.monotonic()
            assert reader.acquire(timeout=10)
            took = time.monotonic() - started
            reader.release()
            if any(marks) or took > 1.0:
                failures.append((run, marks, round(took, 2)))
            for c in clients:
                c.close()
        assert not failures, f"(run, live marks per master, reader's wait s): {failures}"


def test_keys_of_the_marks() -> None:
    """The mark key this test reads is the one the library writes."""
    with Masters(3) as masters:
        n = "rwm-" + uuid.uuid4().hex[:12]
        client = redmutex.Client(masters.urls, prefix="t:")
        reader = redmutex.RWLock(client, n, ttl=10).read()
        assert reader.acquire()
        writer = redmutex.RWLock(client, n, ttl=10).write()
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(writer.acquire(timeout=5)))
        thread.start()
        deadline = time.monotonic() + 5
        while not any(live_marks(masters, f"t:{{{n}}}:rw:writers_waiting")):
            assert time.monotonic() < deadline, "no waiting-writer mark seen"
            time.sleep(0.01)
        reader.release()
        thread.join(10)
        assert got == [True]
        writer.release()
