"""A fair semaphore: at most `limit` holders at once, served in the order they arrived.

    python examples/fair_semaphore.py [REDIS_URL]

Six workers (threads here; any processes alike) want one of two slots of a rate-limited API.
They arrive 100 ms apart; each holds its slot for 300 ms. The semaphore never admits more than
two, and the ones that had to wait get their slot in arrival order (`fair=True`, the default).
A waiter sleeps until a slot is released: no polling.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import redmutex

LIMIT = 2
WORKERS = 6


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    name = f"api-quota:{uuid.uuid4().hex[:8]}"
    guard = threading.Lock()
    arrived: list[int] = []
    served: list[int] = []
    inside = 0
    most_inside = 0

    def worker(i: int) -> None:
        nonlocal inside, most_inside
        sem = redmutex.Semaphore(client, name, LIMIT, ttl=10, timeout=30)
        with guard:
            arrived.append(i)
        with sem:
            with guard:
                served.append(i)
                inside += 1
                most_inside = max(most_inside, inside)
            time.sleep(0.3)  # the API call
            with guard:
                inside -= 1

    threads = []
    for i in range(WORKERS):
        threads.append(threading.Thread(target=worker, args=(i,)))
        threads[-1].start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    client.close()

    print(f"arrived {arrived}, served {served}, at most {most_inside} at once (limit {LIMIT})")
    if most_inside <= LIMIT and served == arrived:
        print("OK: never over the limit, served in arrival order")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
