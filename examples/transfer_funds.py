"""The money transfer of *Redis in Action*, as written, on redmutex's `redis_lock`.

    python examples/transfer_funds.py [REDIS_URL]

`conn` is a plain redis-py client; the lock keys live under redmutex's prefix, the balances are
ordinary hashes. Two accounts get 100 each; alice sends bob 30, then tries to send 500.
"""

from __future__ import annotations

import os
import sys
import uuid

import redis
from redmutex import redis_lock


def transfer_funds(conn: redis.Redis, sender: str, recipient: str, amount: int) -> bool:
    with redis_lock(conn, "lock:" + sender):
        if int(conn.hget(sender, "money") or 0) < amount:
            return False
        pipe = conn.pipeline(True)
        pipe.hincrby(sender, "money", -amount)
        pipe.hincrby(recipient, "money", amount)
        pipe.execute()
        return True


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    conn = redis.Redis.from_url(url, decode_responses=True)
    run = uuid.uuid4().hex[:8]  # fresh account names, so the example can run any number of times
    alice, bob = f"example:{run}:alice", f"example:{run}:bob"
    try:
        conn.hset(alice, "money", 100)
        conn.hset(bob, "money", 100)
        moved = transfer_funds(conn, alice, bob, 30)
        refused = not transfer_funds(conn, alice, bob, 500)
        balances = int(conn.hget(alice, "money") or 0), int(conn.hget(bob, "money") or 0)
        print(f"transferred 30: {moved}; 500 refused: {refused}; balances {balances}")
        if moved and refused and balances == (70, 130):
            print("OK: balances are 70 and 130")
            return 0
        return 1
    finally:
        conn.delete(alice, bob)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
