"""Fencing tokens: the storage refuses a writer whose lease already ended.

    python examples/fencing.py [REDIS_URL]

A lease can end while its holder is paused (a GC pause, swapping, a stopped VM) — and the holder
cannot notice in time. So the storage checks: every write carries `lock.fence`, which strictly
increases across acquisitions of the lock, and a write with a fence lower than one already seen
is refused. Here the storage is SQLite (any database with a conditional UPDATE works):

1. worker A takes the lock (fence n) and stalls past its 300 ms lease;
2. worker B takes the lock (fence n+1) and writes;
3. A wakes up and writes with fence n: the storage refuses it, B's write stands.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import uuid

import redmutex


class Invoices:
    """The protected storage. Its check is the whole point: `WHERE fence < :fence`."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INT, fence INT)")
        self.db.execute("INSERT INTO invoices VALUES (42, 0, 0)")

    def write_total(self, total: int, fence: int) -> bool:
        updated = self.db.execute(
            "UPDATE invoices SET total = ?, fence = ? WHERE id = 42 AND fence < ?",
            (total, fence, fence),
        ).rowcount
        return updated == 1

    def total(self) -> int:
        (total,) = self.db.execute("SELECT total FROM invoices WHERE id = 42").fetchone()
        return int(total)


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    name = f"invoice:42:{uuid.uuid4().hex[:8]}"
    storage = Invoices()

    a = redmutex.Lock(client, name, ttl=0.3)
    a.acquire()
    fence_a = a.fence or 0
    time.sleep(0.5)  # A stalls; its lease ends meanwhile

    with redmutex.Lock(client, name, ttl=10, timeout=5) as b:
        fence_b = b.fence or 0
        b_written = storage.write_total(200, fence_b)

    a_written = storage.write_total(100, fence_a)  # A wakes up and writes, unaware
    try:
        a.release()
    except redmutex.LockLostError:
        print("A's release: LockLostError (its lease had ended)")
    client.close()

    print(f"B (fence {fence_b}) wrote: {b_written}; A (fence {fence_a}) wrote: {a_written}")
    print(f"stored total: {storage.total()}")
    if b_written and not a_written and storage.total() == 200 and fence_b > fence_a:
        print(f"OK: the stale write with fence {fence_a} was refused")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
