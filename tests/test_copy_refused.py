"""Copying or pickling a lock object: refused with TypeError, as for ``threading.Lock``.

A copy would carry the original's hold (its owner token), so two objects would each believe they
hold one lock and either could release it; an unpickled twin in another process likewise. This
covers the blocking objects (pyo3 classes) and the asyncio ones (Python classes over them).
"""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio

WAYS: dict[str, Callable[[Any], object]] = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle.dumps": pickle.dumps,
}


def _blocking_objects(client: redmutex.Client) -> dict[str, Any]:
    rw = redmutex.RWLock(client, "cp-rw", ttl=5)
    return {
        "Client": client,
        "Lock": redmutex.Lock(client, "cp-lock", ttl=5),
        "Semaphore": redmutex.Semaphore(client, "cp-sem", 2, ttl=5),
        "MultiLock": redmutex.MultiLock(client, ["cp-m1", "cp-m2"], ttl=5),
        "RWLock": rw,
        "RWLockSide": rw.write(),
    }


@pytest.mark.timeout(30)
@pytest.mark.parametrize("way", sorted(WAYS))
def test_blocking_objects_refuse_copies_while_held(client: redmutex.Client, way: str) -> None:
    objects = _blocking_objects(client)
    for label in ("Lock", "Semaphore", "MultiLock", "RWLockSide"):
        assert objects[label].acquire(timeout=5)
    try:
        for label, obj in objects.items():
            with pytest.raises(TypeError, match=rf"cannot pickle 'redmutex\.{label}' object"):
                WAYS[way](obj)
    finally:
        for label in ("Lock", "Semaphore", "MultiLock", "RWLockSide"):
            objects[label].release()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("way", sorted(WAYS))
def test_aio_objects_refuse_copies_while_held(
    client: redmutex.Client, r: redis.Redis, prefix: str, way: str
) -> None:
    # Before: copy.copy gave a second aio object over the same core hold (both had the token,
    # both owned() it, the copy's release() ended the original's hold); pickle.dumps of an
    # aio.RWLock raised AttributeError about a WeakValueDictionary.
    async def main() -> None:
        rw = aio.RWLock(client, "acp-rw", ttl=5)
        objects: dict[str, Any] = {
            "Lock": aio.Lock(client, "acp-lock", ttl=5),
            "Semaphore": aio.Semaphore(client, "acp-sem", 2, ttl=5),
            "MultiLock": aio.MultiLock(client, ["acp-m1", "acp-m2"], ttl=5),
            "RWLockSide": rw.write(),
        }
        for obj in objects.values():
            assert await obj.acquire(timeout=5)
        objects["RWLock"] = rw
        try:
            for label, obj in objects.items():
                with pytest.raises(TypeError, match=rf"cannot pickle 'redmutex\.aio\.{label}'"):
                    WAYS[way](obj)
        finally:
            for label, obj in objects.items():
                if label != "RWLock":
                    await obj.release()

    asyncio.run(main())
    assert r.exists(f"{prefix}{{acp-lock}}:lock") == 0
