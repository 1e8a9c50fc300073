"""Demo scenario: a Semaphore limiting concurrent calls to a slow resource.

Eight workers, each with a client of its own (as separate processes would have), make calls to
a resource that takes a while to answer and must never see more than LIMIT callers at once.
The semaphore's holders live in Redis, so the limit holds across processes and hosts; a caller
that died would stop counting when its lease ends.
"""

from __future__ import annotations

import threading
import time
import uuid

from redmutex._core import Client, Semaphore

LIMIT = 3
WORKERS = 8
CALLS_PER_WORKER = 3
CALL_SECONDS = 0.15


class SlowResource:
    """Stands in for an API or a database that allows few concurrent callers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.calls = 0

    def call(self) -> None:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(CALL_SECONDS)
        finally:
            with self._lock:
                self.active -= 1


def semaphore_demo(url: str) -> int:
    """Runs the scenario against the Redis at `url`, prints a short report; 0 when all went well."""
    prefix = f"redmutex-demo-{uuid.uuid4().hex[:8]}:"
    name = "slow-api"
    resource = SlowResource()
    waits: list[float] = []
    errors: list[BaseException] = []
    record = threading.Lock()
    clients = [Client(url, prefix=prefix) for _ in range(WORKERS)]

    def worker(client: Client) -> None:
        try:
            sem = Semaphore(client, name, LIMIT, ttl=10, timeout=30)
            for _ in range(CALLS_PER_WORKER):
                asked = time.monotonic()
                with sem:
                    with record:
                        waits.append(time.monotonic() - asked)
                    resource.call()
        except BaseException as exc:  # noqa: BLE001 - reported below
            with record:
                errors.append(exc)

    print(
        f"semaphore demo: {WORKERS} workers x {CALLS_PER_WORKER} calls to a resource that takes "
        f"{CALL_SECONDS:.2f} s per call and allows {LIMIT} at once"
    )
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    elapsed = time.monotonic() - started
    try:
        left = Semaphore(clients[0], name, LIMIT).holders()
    finally:
        for c in clients:
            c.close()

    total = WORKERS * CALLS_PER_WORKER
    ideal = total * CALL_SECONDS / LIMIT
    print(f"  calls made:        {resource.calls} of {total}")
    print(f"  peak concurrency:  {resource.peak} (limit {LIMIT})")
    print(f"  elapsed:           {elapsed:.2f} s (at best {ideal:.2f} s with {LIMIT} at a time)")
    if waits:
        print(f"  longest wait:      {max(waits):.2f} s for a permit")
    print(f"  holders after:     {left}")
    ok = (
        not errors
        and resource.calls == total
        and resource.peak <= LIMIT
        and left == 0
        and not any(th.is_alive() for th in threads)
    )
    for exc in errors[:3]:
        print(f"  error: {type(exc).__name__}: {exc}")
    print("  result:            " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1
