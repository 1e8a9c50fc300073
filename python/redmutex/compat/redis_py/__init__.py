"""redis-py's `redis.lock.Lock` on redmutex's engine: change one import, keep the code.

    from redis.lock import Lock                    ->  from redmutex.compat.redis_py import Lock
    lock = r.lock("name", timeout=5)               ->  lock = redmutex.compat.redis_py.lock(r, "name", timeout=5)

The key is `name` and its value the token, exactly as redis-py writes them, so processes on
redis-py and on this module exclude each other. Differences (see docs/compat.md): waiters are
woken by releases of this module at once and look again every `sleep` for releases by redis-py;
`timeout=None` is a lease renewed in the background that ends when the holder dies.
"""

from __future__ import annotations

import logging
import threading
import uuid
from types import SimpleNamespace, TracebackType
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import LockError, LockNotOwnedError

from ..._core import _CompatHold, _CompatLock
from .._common import NO_EXPIRY_LEASE, client_of, encode, key_name, token_text

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Lock", "LockError", "LockNotOwnedError", "lock"]

logger = logging.getLogger("redmutex.compat.redis_py")

Number = int | float


class _ThreadLocal(threading.local):
    """Per-thread token, None in every thread that did not acquire (redis-py's plain
    threading.local raises AttributeError there)."""

    def __init__(self) -> None:
        self.token: bytes | None = None
        self.hold: _CompatHold | None = None


class Lock:
    """A distributed lock with redis-py's `redis.lock.Lock` interface (see its docs).

    ``timeout`` is the lease in seconds (None: held until released; here a lease renewed in the
    background, ending when the holder dies). ``sleep`` bounds how long a waiter goes without
    looking when the holder is a plain redis-py process; releases by this module wake waiters
    at once. ``blocking``, ``blocking_timeout``, ``thread_local`` and
    ``raise_on_release_error`` mean what they mean in redis-py.
    """

    def __init__(
        self,
        redis: Any,
        name: str | bytes,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self.redis = redis
        self.name: Any = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = _ThreadLocal() if self.thread_local else SimpleNamespace()
        self.local.token = None
        self._key = encode(redis, name)
        self._core = _CompatLock(client_of(redis), key_name(self._key), self._key)

    # -- the lease -------------------------------------------------------------------------

    def _lease(self) -> tuple[float, bool]:
        """The lease of an acquire and whether it is renewed (redis-py: no timeout, no expiry)."""
        if self.timeout:
            return float(self.timeout), False
        return NO_EXPIRY_LEASE, True

    def _hold(self) -> _CompatHold | None:
        return getattr(self.local, "hold", None)

    def _set(self, token: bytes | None, hold: _CompatHold | None) -> None:
        previous = self._hold()
        if previous is not None and previous is not hold:
            previous.stop()
        self.local.token = token
        self.local.hold = hold

    # -- with ------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    # -- acquire ---------------------------------------------------------------------------

    def _token_of(self, token: str | bytes | None) -> tuple[bytes, bool]:
        if token is None:
            return uuid.uuid1().hex.encode(), False
        return encode(self.redis, token), True

    def acquire(
        self,
        sleep: Number | None = None,
        blocking: bool | None = None,
        blocking_timeout: Number | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Takes the lock; True once acquired, False when not (non-blocking or timed out).

        Waiting is woken by releases through redmutex; a holder on plain redis-py is looked at
        again every ``sleep`` seconds (its releases publish nothing).
        """
        if sleep is None:
            sleep = self.sleep
        raw, chosen = self._token_of(token)
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        wait: float | None
        if not blocking:
            wait = 0.0
        elif blocking_timeout is None:
            wait = None
        else:
            wait = max(float(blocking_timeout), 0.0)
        lease, renew = self._lease()
        hold = self._core.acquire(token_text(raw), lease, wait, chosen, renew, poll=_poll(sleep))
        if hold is None:
            return False
        self._set(raw, hold)
        return True

    def do_acquire(self, token: str | bytes) -> bool:
        """One attempt for ``token`` (redis-py's hook; `acquire` waits in the engine instead)."""
        raw = encode(self.redis, token)
        lease, renew = self._lease()
        hold = self._core.acquire(token_text(raw), lease, 0.0, True, renew)
        if hold is None:
            return False
        self._set(raw, hold)
        return True

    # -- state -----------------------------------------------------------------------------

    def locked(self) -> bool:
        """Whether anybody (any process, on redis-py or here) holds the lock."""
        return self._core.owner() is not None

    def owned(self) -> bool:
        """Whether this object (in this thread, when thread_local) holds the lock."""
        token = self.local.token
        return token is not None and self._core.owner() == token

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (redmutex's addition), None when not held."""
        hold = self._hold()
        return None if hold is None or self.local.token is None else hold.fence

    # -- release ---------------------------------------------------------------------------

    def release(self) -> None:
        """Releases the lock (LockError when not held, LockNotOwnedError when no longer ours)."""
        expected_token = self.local.token
        if expected_token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        self._set(None, None)
        self.do_release(expected_token)

    def do_release(self, expected_token: str | bytes) -> None:
        raw = encode(self.redis, expected_token)
        if not self._core.release(token_text(raw)):
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self.name
            )

    # -- extend ----------------------------------------------------------------------------

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Adds ``additional_time`` seconds to the lease (or, ``replace_ttl``, sets it)."""
        if self.local.token is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> Literal[True]:
        ms = int(additional_time * 1000)
        if self._core.extend(token_text(self.local.token), ms, bool(replace_ttl)) < 0:
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return True

    def reacquire(self) -> Literal[True]:
        """Resets the lease to ``timeout`` seconds from now."""
        if self.local.token is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)
        return self.do_reacquire()

    def do_reacquire(self) -> Literal[True]:
        ms = int(float(self.timeout or 0) * 1000)
        if self._core.extend(token_text(self.local.token), ms, True) < 0:
            raise LockNotOwnedError(
                "Cannot reacquire a lock that's no longer owned", lock_name=self.name
            )
        return True

    def __repr__(self) -> str:
        return f"<redmutex.compat.redis_py.Lock name={self.name!r} timeout={self.timeout!r}>"


def _poll(sleep: Number) -> float:
    """How often a waiter looks again while a plain redis-py process holds the lock."""
    try:
        seconds = float(sleep)
    except (TypeError, ValueError):
        raise TypeError(
            f"sleep: expected a number of seconds, not {type(sleep).__name__}"
        ) from None
    if not seconds > 0:  # also NaN
        seconds = 0.001
    return min(seconds, 86400.0)


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
    """`Redis.lock` as a function: ``redis.lock(name, ...)`` becomes ``lock(redis, name, ...)``."""
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
