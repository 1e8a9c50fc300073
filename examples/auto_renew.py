"""`auto_renew=True` keeps a lease alive while you hold it; `on_lost` tells you if it still ends.

    python examples/auto_renew.py [REDIS_URL]

1. A job holds a lock with a 1 s lease for 2.5 s: renewal (every ttl/3, from a Rust thread)
   keeps it, and nobody else can take it meanwhile.
2. Then the key is deleted behind the holder's back (what an operator's
   `python -m redmutex release NAME --force`, a failover or a flushed Redis would do): renewal
   finds the lease gone, `lock.lost` becomes True, `on_lost(lock)` is called once, and leaving the
   `with` block raises `LockLostError` so the job knows its work was not protected to the end.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import redis
import redmutex


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    name = f"nightly-job:{uuid.uuid4().hex[:8]}"
    lost_event = threading.Event()

    def on_lost(lock: redmutex.Lock) -> None:
        print(f"on_lost: the lease of {lock.name!r} ended while it was held")
        lost_event.set()

    lock = redmutex.Lock(client, name, ttl=1, auto_renew=True, on_lost=on_lost)
    kept = False
    raised = False
    try:
        with lock:
            time.sleep(2.5)  # work for longer than the lease
            rival = redmutex.Lock(client, name, ttl=1)
            kept = lock.owned() and not rival.acquire(blocking=False)
            print(f"after 2.5 s with a 1 s lease: still owned = {kept}")

            conn = redis.Redis.from_url(url)
            conn.delete(f"{client.prefix}{{{name}}}:lock")  # the lease is taken away
            conn.close()
            lost_event.wait(5)
            print(f"lock.lost = {lock.lost}")
    except redmutex.LockLostError as exc:
        raised = True
        print(f"leaving the block raised LockLostError: {exc}")
    client.close()
    if kept and lost_event.is_set() and raised:
        print("OK: renewed while held, and the loss was reported")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
