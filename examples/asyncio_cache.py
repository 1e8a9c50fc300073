"""`@redmutex.aio.cached`: one slow fill for a crowd of tasks, the others awaken with its value.

    python examples/asyncio_cache.py [REDIS_URL]

Twenty tasks ask for the same cold report at once. One of them runs the slow `async def`
(0.3 s); the others wait without polling and without blocking the event loop, and get the value
as soon as it is stored. Asking again is a plain cache hit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

import redmutex
from redmutex import aio


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    fills = 0

    @aio.cached(client, ttl=60, key="report:{day}:" + uuid.uuid4().hex[:8])
    async def daily_report(day: str) -> dict[str, object]:
        nonlocal fills
        fills += 1
        await asyncio.sleep(0.3)  # the expensive query
        return {"day": day, "total": 1234}

    started = time.monotonic()
    reports = await asyncio.gather(*(daily_report("2026-11-21") for _ in range(20)))
    took = time.monotonic() - started
    print(f"20 tasks got the report in {took:.2f} s; the fill ran {fills} time(s)")
    hit_started = time.monotonic()
    again = await daily_report("2026-11-21")
    print(f"asked again: a cache hit in {(time.monotonic() - hit_started) * 1000:.1f} ms")
    await daily_report.invalidate("2026-11-21")
    client.close()
    if fills == 1 and all(r == again for r in reports):
        print("OK: one fill, every task got its value")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
