"""An asyncio acquire cancelled after its wait ended in Redis but before the loop resolved its
future: the object held the hold for one more turn of the loop, so a retry right after the
cancel (`async with asyncio.timeout(t): await lock.acquire()` in a loop, retried on
TimeoutError) raised "this Lock object already holds the lock" (an audit's repro: about 7 % of
its retries). The cancel now finds the ended acquire and gives its hold back at once.

The test is the audit's retry loop, whose timeouts land at every point of the hand-off."""

from __future__ import annotations

import asyncio
import random
import sys
import time

import pytest
import redmutex
from redmutex import aio

RETRIES = 200


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
def test_a_retry_after_a_timed_out_acquire_never_finds_the_object_holding(
    client: redmutex.Client, other_client: redmutex.Client
) -> None:
    name = "settled-cancel-retry"
    refused: list[str] = []

    async def main() -> None:
        started = time.monotonic()
        for _ in range(RETRIES):
            if time.monotonic() - started > 60:
                break
            holder = aio.Lock(other_client, name, ttl=5)
            assert await holder.acquire(timeout=5)
            lock = aio.Lock(client, name, ttl=5)

            async def user(lock: aio.Lock = lock) -> None:
                deadline = 0.02 + random.uniform(0, 0.003)  # around the release below
                while True:
                    try:
                        async with asyncio.timeout(deadline):
                            await lock.acquire()
                        break
                    except TimeoutError:
                        deadline = 5.0  # retry, waiting longer
                await lock.release()

            task = asyncio.create_task(user())
            await asyncio.sleep(0.02)
            await holder.release()
            try:
                await task
            except redmutex.LockError as exc:
                refused.append(str(exc))
                await asyncio.sleep(0.1)  # the lock goes with its given-back hold

    asyncio.run(main())
    assert refused == [], f"{len(refused)} of the retries were refused"
