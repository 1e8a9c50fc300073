"""`redmutex.aio.Lock`: the same lock for asyncio, with `async with`.

    python examples/asyncio_lock.py [REDIS_URL]

Three jobs want the same lock; they run one at a time. Waiting happens in the Rust runtime, so
the event loop stays free: a ticker task keeps ticking all along.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
import uuid

import redmutex
from redmutex import aio


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    name = f"job:7:{uuid.uuid4().hex[:8]}"
    spans: list[tuple[float, float]] = []
    ticks = 0

    async def job(i: int) -> None:
        async with aio.Lock(client, name, ttl=5, timeout=10) as lock:
            start = time.monotonic()
            print(f"job {i} holds the lock (fence {lock.fence})")
            await asyncio.sleep(0.2)  # the work; other jobs wait without blocking the loop
            spans.append((start, time.monotonic()))

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    await asyncio.gather(*(job(i) for i in range(3)))
    tick_task.cancel()
    client.close()

    spans.sort()
    one_at_a_time = all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(spans))
    print(f"jobs ran one at a time: {one_at_a_time}; the loop ticked {ticks} times meanwhile")
    if one_at_a_time and len(spans) == 3 and ticks > 10:
        print("OK: exclusive, and the event loop never blocked")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
