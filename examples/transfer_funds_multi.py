"""The money transfer of *Redis in Action*, made safe for both accounts with `MultiLock`.

    python examples/transfer_funds_multi.py [REDIS_URL]

The book locks only the sender, so a transfer into an account can interleave with a transfer
out of it. Here each transfer holds both accounts' locks at once (all or none), and reads and
writes the balances without MULTI: the locks alone keep them right. Eight processes move money
both ways between the same two accounts — half alice -> bob, half bob -> alice, so their
MultiLocks name the accounts in crossing orders — and the total is checked at the end: money
conserved, no balance ever negative, and no deadlock (every transfer gets its locks in time).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
import uuid

import redis
import redmutex

PROCESSES = 8
TRANSFERS = 40  # per process
START = 500  # each account's opening balance


def transfer_funds(conn: redis.Redis, sender: str, recipient: str, amount: int) -> bool:
    # Both accounts or neither: a MultiLock over the two lock names, taken in one step.
    with redmutex.MultiLock(conn, ["lock:" + sender, "lock:" + recipient], ttl=10, timeout=30):
        funds = int(conn.hget(sender, "money") or 0)
        if funds < amount:
            return False
        received = int(conn.hget(recipient, "money") or 0)
        # Plain read-modify-write on both hashes: only the locks make this safe.
        conn.hset(sender, "money", funds - amount)
        conn.hset(recipient, "money", received + amount)
        if funds - amount < 0:
            raise AssertionError("a balance went negative")
        return True


def worker(url: str, sender: str, recipient: str, seed: int) -> int:
    """One process: TRANSFERS random amounts from sender to recipient; how many went through."""
    conn = redis.Redis.from_url(url, decode_responses=True)
    rng = random.Random(seed)
    done = 0
    try:
        for _ in range(TRANSFERS):
            done += transfer_funds(conn, sender, recipient, rng.randint(1, 60))
    finally:
        conn.close()
    return done


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    conn = redis.Redis.from_url(url, decode_responses=True)
    run = uuid.uuid4().hex[:8]  # fresh account names, so the example can run any number of times
    alice, bob = f"example:{run}:alice", f"example:{run}:bob"
    try:
        conn.hset(alice, "money", START)
        conn.hset(bob, "money", START)
        jobs = [
            (url, alice, bob, i) if i % 2 == 0 else (url, bob, alice, i) for i in range(PROCESSES)
        ]
        with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
            moved = pool.starmap(worker, jobs)
        balances = int(conn.hget(alice, "money") or 0), int(conn.hget(bob, "money") or 0)
        conserved = sum(balances) == 2 * START
        print(f"{PROCESSES} processes, {sum(moved)} of {PROCESSES * TRANSFERS} transfers made")
        print(f"balances {balances}; money conserved: {conserved}")
        if conserved and min(balances) >= 0:
            print("OK: money conserved, no balance negative, no deadlock")
            return 0
        return 1
    finally:
        conn.delete(alice, bob)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
