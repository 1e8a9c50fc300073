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
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import LockError, LockNotOwnedError

from .._common import encode, token_text
from ._base import LockBase, Number, extend_ms, poll_of

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Lock", "LockError", "LockNotOwnedError", "lock"]

#: redis-py's own logger (`redis.lock`), so a program's logging set-up for it still applies.
logger = logging.getLogger("redis.lock")


def _init_local(local: Any) -> None:
    local.token = None
    local.hold = None


# One class per `threading.local` seen (gevent's patching replaces it with its greenlet-local).
_local_classes: dict[type[Any], type[Any]] = {}


def _thread_local() -> Any:
    """Per-thread token, None in every thread that did not acquire (redis-py's plain
    threading.local raises AttributeError there). Made from `threading.local` as it is when the
    Lock is made, as redis-py's is: under gevent's patching, after this module was imported
    too (gunicorn's ``--preload``), a greenlet's."""
    base: type[Any] = threading.local
    made = _local_classes.get(base)
    if made is None:
        made = _local_classes.setdefault(
            base, type("_ThreadLocal", (base,), {"__init__": _init_local})
        )
    return made()


class Lock(LockBase):
    """A distributed lock with redis-py's `redis.lock.Lock` interface (see its docs).

    ``timeout`` is the lease in seconds (None: held until released; here a lease renewed in the
    background, ending when the holder dies). ``sleep`` bounds how long a waiter goes without
    looking when the holder is a plain redis-py process; releases by this module wake waiters
    at once. ``blocking``, ``blocking_timeout``, ``thread_local`` and
    ``raise_on_release_error`` mean what they mean in redis-py.
    """

    def _new_local(self) -> Any:
        return _thread_local()

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
        wait = self._wait(blocking, blocking_timeout)
        lease, renew = self._lease()
        every, bad_sleep = poll_of(sleep)
        if bad_sleep is not None:
            wait = 0.0  # one attempt: redis-py reads sleep only to wait
        hold = self._core.acquire(token_text(raw), lease, wait, chosen, renew, poll=every)
        if hold is None:
            if bad_sleep is not None and self._blocks(blocking):
                raise bad_sleep
            return False
        self._set(raw, hold, renew)
        return True

    def do_acquire(self, token: str | bytes) -> bool:
        """One attempt for ``token`` (redis-py's hook; `acquire` waits in the engine instead).
        As redis-py's, it only takes the key: ``local.token`` is left as it was."""
        raw = encode(self.redis, token)
        lease, renew = self._lease()
        hold = self._core.acquire(token_text(raw), lease, 0.0, True, renew)
        if hold is None:
            return False
        self._took(raw, hold, renew)
        return True

    # -- state -----------------------------------------------------------------------------

    def locked(self) -> bool:
        """Whether anybody (any process, on redis-py or here) holds the lock."""
        return self._core.owner() is not None

    def owned(self) -> bool:
        """Whether this object (in this thread, when thread_local) holds the lock."""
        token = self._token()
        return token is not None and self._core.owner() == token

    # -- release ---------------------------------------------------------------------------

    def release(self) -> None:
        """Releases the lock (LockError when not held, LockNotOwnedError when no longer ours)."""
        expected_token = self._token()
        if expected_token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        self._set(None, None)
        self.do_release(expected_token)

    def do_release(self, expected_token: str | bytes) -> None:
        raw = encode(self.redis, expected_token)
        self._stop_renewal(raw)  # a hold without timeout, whichever object (thread) took it
        if not self._core.release(token_text(raw)):
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self.name
            )

    # -- extend ----------------------------------------------------------------------------

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Adds ``additional_time`` seconds to the lease (or, ``replace_ttl``, sets it)."""
        if self._token() is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> Literal[True]:
        token = self._held_token(self._token(), "extend")
        if self._no_expiry():
            raise self._no_expiry_error("extend")
        ms = extend_ms(additional_time)
        if self._core.extend(token, ms, bool(replace_ttl)) < 0:
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return True

    def reacquire(self) -> Literal[True]:
        """Resets the lease to ``timeout`` seconds from now."""
        if self._token() is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)
        return self.do_reacquire()

    def do_reacquire(self) -> Literal[True]:
        token = self._held_token(self._token(), "reacquire")
        if self._no_expiry():
            raise self._no_expiry_error("reacquire")
        ms = int(float(self.timeout or 0) * 1000)
        if self._core.extend(token, ms, True) < 0:
            raise LockNotOwnedError(
                "Cannot reacquire a lock that's no longer owned", lock_name=self.name
            )
        return True

    def __repr__(self) -> str:
        return f"<redmutex.compat.redis_py.Lock name={self.name!r} timeout={self.timeout!r}>"


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
