"""redis-py's `redis.asyncio.lock.Lock` on redmutex's engine (see `redmutex.compat.redis_py`).

    from redis.asyncio.lock import Lock   ->  from redmutex.compat.redis_py.asyncio import Lock
    lock = r.lock("name", timeout=5)      ->  lock = redmutex.compat.redis_py.asyncio.lock(r, "name", timeout=5)

One fix over redis-py: with ``thread_local=True`` (the default) the token belongs to the asyncio
task that acquired, not to the thread, so another task using the same Lock object neither sees
nor releases it while that task runs (in redis-py every task of the loop's thread shares one
token). Once the task has ended, the next task that uses the object takes the token over, so a
lock acquired through ``asyncio.wait_for`` (a child task before Python 3.12) is its caller's.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import LockError, LockNotOwnedError

from ..._core import _CompatHold
from .._common import encode, token_text
from ._base import LockBase, Number, extend_ms, poll_of

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Lock", "LockError", "LockNotOwnedError", "lock"]

#: redis-py's own logger (`redis.asyncio.lock`), so a program's logging set-up for it applies.
logger = logging.getLogger("redis.asyncio.lock")


class TaskLocal:
    """Attributes kept per asyncio task (per thread outside any task), like threading.local.

    A hold outlives the task that took it: once that task has ended, the next task that uses
    the object takes its token over (so `await asyncio.wait_for(lock.acquire(), t)`, `gather`
    or `shield`, which acquire in a task of their own before Python 3.12, leave the lock to
    the task that awaited them, as redis-py's one token per thread does). A task that still
    runs keeps its token to itself."""

    def __init__(self) -> None:
        object.__setattr__(self, "_by_task", weakref.WeakKeyDictionary())
        object.__setattr__(self, "_outside", {})
        # The slots of the tasks that hold a token, kept (with their task) until it is cleared
        # or taken over: an ended task's hold must not vanish with the task object.
        object.__setattr__(self, "_holders", {})

    def _slots(self) -> dict[str, Any]:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None:
            outside: dict[str, Any] = object.__getattribute__(self, "_outside")
            return outside
        by_task: weakref.WeakKeyDictionary[Any, dict[str, Any]] = object.__getattribute__(
            self, "_by_task"
        )
        slots = by_task.setdefault(task, {})
        if slots.get("token") is None:
            self._take_over(task, slots)
        return slots

    def _take_over(self, task: Any, slots: dict[str, Any]) -> None:
        """Moves the hold of an ended task (the latest, if several) into `task`'s `slots`."""
        holders: dict[Any, dict[str, Any]] = object.__getattribute__(self, "_holders")
        ended = [other for other in holders if other is not task and other.done()]
        if not ended:
            return
        left = holders.pop(ended[-1])
        slots.update(left)
        holders[task] = slots
        by_task: weakref.WeakKeyDictionary[Any, dict[str, Any]] = object.__getattribute__(
            self, "_by_task"
        )
        by_task.pop(ended[-1], None)

    def _clear(self, token: bytes, hold: Any) -> None:
        """Clears the token and hold of the slots that still hold `token` with `hold` (the
        caller's task's, or those of the task that took them over, or outside any task),
        whichever task is running."""
        holders: dict[Any, dict[str, Any]] = object.__getattribute__(self, "_holders")
        outside: dict[str, Any] = object.__getattribute__(self, "_outside")
        for task, slots in list(holders.items()):
            if slots.get("token") is token and slots.get("hold") is hold:
                del holders[task]
                slots.update(token=None, hold=None, taken=None)
        if outside.get("token") is token and outside.get("hold") is hold:
            outside.update(token=None, hold=None, taken=None)

    def __getattr__(self, name: str) -> Any:
        slots = self._slots()
        if name in slots:
            return slots[name]
        if name == "token":
            return None
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        slots = self._slots()
        slots[name] = value
        if name != "token":
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None:
            return
        holders: dict[Any, dict[str, Any]] = object.__getattribute__(self, "_holders")
        if value is None:
            holders.pop(task, None)
        else:
            holders[task] = slots


class Lock(LockBase):
    """A distributed lock with redis-py's `redis.asyncio.lock.Lock` interface (see its docs)."""

    _local_class = TaskLocal

    async def __aenter__(self) -> Self:
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def _settled(self, attempt: Any, raw: bytes, lease: float) -> _CompatHold | None:
        """The hold an acquire's awaitable gives. Cancelled before it settled, the engine gives
        back what it takes; cancelled after (it succeeded, but this task had not resumed), that
        hold belongs to nobody: it is given back here."""
        try:
            hold: _CompatHold | None = await attempt
        except asyncio.CancelledError:
            if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
                taken = attempt.result()
                if taken is not None:
                    taken.stop()
                    self._core._give_back(token_text(raw), lease)
            raise
        return hold

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: Number | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Takes the lock; True once acquired, False when not (non-blocking or timed out)."""
        raw, chosen = self._token_of(token)
        wait = self._wait(blocking, blocking_timeout)
        lease, renew = self._lease()
        every, bad_sleep = poll_of(self.sleep)
        if bad_sleep is not None:
            wait = 0.0  # one attempt: redis-py reads sleep only to wait
        attempt = self._core._acquire_async(token_text(raw), lease, wait, chosen, renew, poll=every)
        hold = await self._settled(attempt, raw, lease)
        if hold is None:
            if bad_sleep is not None and self._blocks(blocking):
                raise bad_sleep
            return False
        self._set(raw, hold, renew)
        return True

    async def do_acquire(self, token: str | bytes) -> bool:
        """One attempt for ``token`` (redis-py's hook; `acquire` waits in the engine instead).
        As redis-py's, it only takes the key: ``local.token`` is left as it was."""
        raw = encode(self.redis, token)
        lease, renew = self._lease()
        attempt = self._core._acquire_async(token_text(raw), lease, 0.0, True, renew)
        hold = await self._settled(attempt, raw, lease)
        if hold is None:
            return False
        self._took(raw, hold, renew)
        return True

    async def locked(self) -> bool:
        """Whether anybody holds the lock."""
        return await self._core._owner_async() is not None

    # owned(), release() and the extends read this task's token as they are called, not when
    # their coroutine first runs: awaited through `asyncio.gather`, `create_task` or (before
    # Python 3.12) `asyncio.wait_for`, that is another task, which has no token of its own
    # (redis-py's one token per thread is the same in every task; `release()` reads it at the
    # call there too).

    def owned(self) -> Awaitable[bool]:
        """Whether this object (in this task, when thread_local) holds the lock."""
        return self._owned(self._token())

    async def _owned(self, token: bytes | None) -> bool:
        return token is not None and await self._core._owner_async() == token

    def release(self) -> Awaitable[None]:
        """Releases the lock (LockError when not held, LockNotOwnedError when no longer ours),
        as an awaitable that raises them when awaited, like redis-py's `async def release`.

        As in redis-py, the token is cleared only once the release is done in Redis (or Redis
        answered that the lock is no longer ours): a release cancelled before it ran, or one
        that failed (ConnectionError), leaves the object holding, and the caller may try again.
        Renewal (no timeout) stops once the release is sent, whatever its outcome, as for
        redmutex's own Lock: a release that failed leaves the lease to end within its ttl
        unless a retry releases it first."""
        expected_token = self._token()
        return self._release(expected_token, self._hold())

    async def _release(self, expected_token: bytes | None, hold: _CompatHold | None) -> None:
        if expected_token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        if hold is not None:
            hold.stop()  # renewed no more once a release is attempted (do_release stops it too)
        try:
            await self.do_release(expected_token)
        except LockNotOwnedError:
            self._forget(expected_token, hold)  # nothing left in Redis: as redis-py does
            raise
        self._forget(expected_token, hold)

    def _forget(self, token: bytes, hold: _CompatHold | None) -> None:
        """Clears the hold `release()` was called for (`token`, `hold`), in the task that holds
        it now (the caller's, or the one that took it over), unless it was replaced since."""
        local = self.local
        if isinstance(local, TaskLocal):
            local._clear(token, hold)
        elif local.token is token and getattr(local, "hold", None) is hold:
            local.token = None
            local.hold = None
            local.taken = None

    async def do_release(self, expected_token: bytes) -> None:
        raw = encode(self.redis, expected_token)
        self._stop_renewal(raw)  # a hold without timeout, whichever object (task) took it
        if not await self._core._release_async(token_text(raw)):
            raise LockNotOwnedError("Cannot release a lock that's no longer owned")

    def extend(
        self, additional_time: Number, replace_ttl: bool = False
    ) -> Awaitable[Literal[True]]:
        """Adds ``additional_time`` seconds to the lease (or, ``replace_ttl``, sets it)."""
        if self._token() is None:
            raise LockError("Cannot extend an unlocked lock")
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout")
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> Awaitable[Literal[True]]:
        token = self._token()
        if token is None or self._no_expiry():
            return self._extend("extend", token, 0, False)  # raises when awaited
        ms = extend_ms(additional_time)
        return self._extend("extend", token, ms, bool(replace_ttl))

    async def _extend(
        self, what: str, token: bytes | None, ms: int, replace: bool
    ) -> Literal[True]:
        held = self._held_token(token, what)
        if self._no_expiry():
            raise self._no_expiry_error(what)
        if await self._core._extend_async(held, ms, replace) < 0:
            raise LockNotOwnedError(f"Cannot {what} a lock that's no longer owned")
        return True

    def _no_expiry_error(self, what: str) -> LockError:
        error = super()._no_expiry_error(what)
        error.lock_name = None  # redis-py's asyncio Lock names no lock in these errors
        return error

    def reacquire(self) -> Awaitable[Literal[True]]:
        """Resets the lease to ``timeout`` seconds from now."""
        if self._token() is None:
            raise LockError("Cannot reacquire an unlocked lock")
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout")
        return self.do_reacquire()

    def do_reacquire(self) -> Awaitable[Literal[True]]:
        ms = int(float(self.timeout or 0) * 1000)  # 0 (no expiry) is refused when awaited
        return self._extend("reacquire", self._token(), ms, True)

    def __repr__(self) -> str:
        return (
            f"<redmutex.compat.redis_py.asyncio.Lock name={self.name!r} timeout={self.timeout!r}>"
        )


def lock(
    redis: Any,
    name: str | bytes,
    timeout: Number | None = None,
    sleep: Number = 0.1,
    blocking: bool = True,
    blocking_timeout: Number | None = None,
    lock_class: Any = None,
    thread_local: bool = True,
    raise_on_release_error: bool = True,
) -> Any:
    """`redis.asyncio.Redis.lock` as a function: ``lock(redis, name, ...)``."""
    if lock_class is None:
        lock_class = Lock
    return lock_class(
        redis,
        name,
        timeout=timeout,
        sleep=sleep,
        blocking=blocking,
        blocking_timeout=blocking_timeout,
        thread_local=thread_local,
        raise_on_release_error=raise_on_release_error,
    )
