"""A lock object: `with redmutex.Lock(...)`, its owner token, fencing token and lease.

    python examples/with_lock.py [REDIS_URL]

While the block holds the lock, a second Lock object on the same name (as another process would
have) cannot take it; after the block it can.
"""

from __future__ import annotations

import os
import sys
import uuid

import redmutex


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    name = f"report:daily:{uuid.uuid4().hex[:8]}"
    with redmutex.Client(url) as client:
        with redmutex.Lock(client, name, ttl=30, timeout=5) as lock:
            left = lock.remaining() or 0.0
            print(f"holding {name!r}: token {lock.token}, fence {lock.fence}, {left:.1f} s left")
            other = redmutex.Lock(client, name, ttl=30)
            taken_meanwhile = other.acquire(blocking=False)
            print(f"another worker tries meanwhile: acquired={taken_meanwhile}")
        taken_after = other.acquire(blocking=False)
        print(f"after the block: acquired={taken_after}, fence {other.fence}")
        other.release()
    if not taken_meanwhile and taken_after:
        print("OK: one holder at a time")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
