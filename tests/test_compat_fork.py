"""A forked child's copy of a shim lock that its parent holds: the child holds none of its
parent's locks (API.md), so leaving a `with` block in the child must not release the parent's
hold. The originals' copies release it by token / id (the child's exit from the block deleted
the key while the parent was still inside): both shims did too."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from _helpers import in_a_forked_child
from redis.exceptions import LockError
from redmutex.compat import redis_lock as prl
from redmutex.compat import redis_py


def _leave_the_block(lock: Any, state: Callable[[], dict[str, Any]]) -> Callable[[], dict]:
    def child() -> dict[str, Any]:
        seen = state()
        try:
            lock.__exit__(None, None, None)  # the child runs on past the fork, out of the block
            seen["left"] = "released"
        except (LockError, prl.NotAcquired) as exc:  # the originals' "not held" errors
            seen["left"] = type(exc).__name__
        return seen

    return child


@pytest.mark.parametrize("timeout", [30, None])
def test_redis_py_shim_child_does_not_release_the_parents_hold(
    r: redis.Redis, timeout: float | None
) -> None:
    name = f"fork-{uuid.uuid4().hex[:8]}"
    lock = redis_py.Lock(r, name, timeout=timeout)
    with lock:
        token = r.get(name)
        seen = in_a_forked_child(
            _leave_the_block(lock, lambda: {"owned": lock.owned(), "fence": lock.fence})
        )
        assert seen == {"owned": False, "fence": None, "left": "LockError"}
        assert r.get(name) == token  # still the parent's
        assert lock.owned()
    assert r.get(name) is None


@pytest.mark.parametrize("expire", [30, None])
def test_redis_lock_shim_child_does_not_release_the_parents_hold(
    r: redis.Redis, expire: int | None
) -> None:
    name = f"fork-{uuid.uuid4().hex[:8]}"
    lock = prl.Lock(r, name, expire=expire)
    with lock:
        seen = in_a_forked_child(_leave_the_block(lock, lambda: {"fence": lock.fence}))
        assert seen == {"fence": None, "left": "NotAcquired"}
        assert lock.get_owner_id() == lock.id  # still the parent's
        assert lock.fence is not None
    assert not lock.locked()
    # A Lock the child makes with the id still releases it, as python-redis-lock's docs say.
    lock.acquire()
    assert in_a_forked_child(lambda: {"r": prl.Lock(r, name, id=lock.id).release()}) == {"r": None}
    assert not lock.locked()
    with pytest.raises(prl.NotAcquired):
        lock.release()  # and the parent's renewal (expire=None) stops, rather than find it lost
