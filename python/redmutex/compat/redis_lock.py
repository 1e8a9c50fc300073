"""python-redis-lock's `redis_lock` on redmutex's engine: change one import, keep the code.

    import redis_lock                      ->  from redmutex.compat import redis_lock

The lock key is `lock:NAME` with the lock's id as its value, and every release pushes the
signal list `lock-signal:NAME`, exactly as python-redis-lock does, so processes on the original
and on this module exclude each other and wake each other's waiters. Differences (see
docs/compat.md): renewal runs on redmutex's engine and never dies silently (a lost lease is
logged and shows in `Lock.lost`); `expire=None` is a lease renewed in the background that ends
when the holder dies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from base64 import b64encode
from os import urandom
from types import TracebackType
from typing import TYPE_CHECKING, Any

from redis import StrictRedis

from .._core import _CompatHold, _CompatLock
from ._common import (
    NO_EXPIRY_LEASE,
    client_of,
    keep_renewing,
    renews,
    server_of,
    stop_renewing,
    stop_renewing_key,
    token_text,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "AlreadyAcquired",
    "AlreadyStarted",
    "InvalidTimeout",
    "Lock",
    "NotAcquired",
    "NotExpirable",
    "TimeoutNotUsable",
    "TimeoutTooLarge",
    "reset_all",
]

#: python-redis-lock's own logger for acquires (`redis_lock.acquire`), so a program's logging
#: set-up for it (often: quietening the warning of a failed non-blocking acquire) still applies.
logger = logging.getLogger("redis_lock.acquire")

#: The longest a waiter sleeps on the signal list before looking again without a signal (a
#: lease that ended without a release pushes none): the holder's remaining lease, at most this.
_LONGEST_NAP = 1.0


class AlreadyAcquired(RuntimeError):
    pass


class NotAcquired(RuntimeError):
    pass


class AlreadyStarted(RuntimeError):
    pass


class TimeoutNotUsable(RuntimeError):
    pass


class InvalidTimeout(RuntimeError):
    pass


class TimeoutTooLarge(RuntimeError):
    pass


class NotExpirable(RuntimeError):
    pass


def _whole_seconds(expire: Any) -> int:
    """A given `expire` as python-redis-lock uses it: whole seconds, at least 1 (the original
    sends int(expire) to Redis, which refuses 0 at acquire, and whose EXPIRE 0 in extend()
    deletes the lock)."""
    seconds = int(expire)
    if seconds < 0:
        raise ValueError("A negative expire is not acceptable.")
    if seconds == 0:
        raise ValueError(
            f"expire: {expire!r} is less than 1 second; python-redis-lock counts whole seconds "
            "(int(expire) would be 0, which Redis refuses); use at least 1, or None/0 for no "
            "expiry"
        )
    return seconds


class Lock:
    """python-redis-lock's `Lock` (see its docs): a lock held by this instance, keyed by id."""

    def __init__(
        self,
        redis_client: Any,
        name: str,
        expire: float | None = None,
        id: str | bytes | None = None,
        auto_renewal: bool = False,
        strict: bool = True,
        signal_expire: int = 1000,
        blocking: bool = True,
    ) -> None:
        if strict and not isinstance(redis_client, StrictRedis):
            raise ValueError(
                "redis_client must be instance of StrictRedis. "
                "Use strict=False if you know what you're doing."
            )
        if auto_renewal and expire is None:
            raise ValueError("Expire may not be None when auto_renewal is set")
        self._client = redis_client
        expire_s: int | None
        if expire:
            expire_s = _whole_seconds(expire)
        else:
            # python-redis-lock: a falsy expire (None, 0) is no expiry.
            if auto_renewal:
                raise ValueError(
                    f"expire: {expire!r} means no expiry, which auto_renewal cannot renew "
                    "(the original fails on it too); give at least 1 second"
                )
            expire_s = None
        self._expire = expire_s
        self._signal_expire = signal_expire
        if id is None:
            self._id = b64encode(urandom(18)).decode("ascii")
        elif isinstance(id, bytes):
            try:
                self._id = id.decode("ascii")
            except UnicodeDecodeError:
                self._id = b64encode(id).decode("ascii")
        elif isinstance(id, str):
            self._id = id
        else:
            raise TypeError(f"Incorrect type for `id`. Must be bytes/str not {type(id)}.")
        self._name = "lock:" + name
        self._signal = "lock-signal:" + name
        self._lock_renewal_interval = float(expire_s or 0) * 2 / 3 if auto_renewal else None
        self.blocking = blocking
        client = client_of(redis_client)
        self._server = server_of(client)
        self._core = _CompatLock(
            client,
            self._name,
            self._name.encode(),
            signal=self._signal.encode(),
            signal_expire_ms=max(int(signal_expire), 1),
        )
        self._hold: _CompatHold | None = None
        #: The process whose acquire took `_hold`: in a forked child the hold stays the parent's.
        self._taken_in: int | None = None
        self._state = threading.Lock()

    @property
    def id(self) -> str:
        return self._id

    @property
    def _held(self) -> bool:
        return self.id == self.get_owner_id()

    def _inherited(self) -> bool:
        """Whether this is a forked child's copy of a Lock whose hold its parent took: the child
        holds none of its parent's locks, so the copy must not release or extend it (the
        original's does, by id). A Lock the child makes with that id still may."""
        return self._taken_in is not None and self._taken_in != os.getpid()

    def _own_hold(self) -> _CompatHold | None:
        return None if self._inherited() else self._hold

    @property
    def lost(self) -> bool:
        """redmutex's addition: renewal found the lease gone (it also logs a WARNING)."""
        hold = self._own_hold()
        return hold is not None and hold.lost

    @property
    def fence(self) -> int | None:
        """redmutex's addition: the fencing token of the current hold, None when not held."""
        hold = self._own_hold()
        return None if hold is None else hold.fence

    def get_owner_id(self) -> str | None:
        owner = self._core.owner()
        return None if owner is None else owner.decode("ascii", "replace")

    @property
    def _where(self) -> tuple[str, bytes, str]:
        """The registry's key of this lock's hold by this id (see `_common.keep_renewing`)."""
        return self._server, self._name.encode(), self._id

    def reset(self) -> None:
        """Forcibly deletes the lock, waking its waiters. Use this with care."""
        stop_renewing_key(self._server, self._name.encode())
        self._core.reset()

    def _renews(self) -> bool:
        return self._expire is None or self._lock_renewal_interval is not None

    def _try(self) -> bool:
        lease = float(self._expire) if self._expire else NO_EXPIRY_LEASE
        token = token_text(self._id.encode(), "id")
        hold = self._core.acquire(token, lease, 0.0, True, self._renews())
        if hold is None:
            return False
        with self._state:
            # A renewed hold never released (its lease lost): the original raises AlreadyStarted
            # then, its renewal thread still set, and so do we below, without keeping this hold.
            started = self._own_hold() if self._lock_renewal_interval is not None else None
            self._hold = hold if started is None else None
            self._taken_in = os.getpid()
        if self._expire is None:
            # Held until released through any Lock with this id, as the original's key is:
            # the renewal outlives this object.
            keep_renewing(self._where, hold, self._core)
        else:
            # The lock was free: a renewal this process still runs for the id belongs to a hold
            # released elsewhere, and must not keep this expiring one alive.
            stop_renewing(self._where)
        if started is not None:
            started.stop()
            # The caller is told the acquire failed, so it must not hold the key (the
            # original's stayed until its expire; renewed here, it would stay for ever).
            hold.stop()
            self._core.release(token)
            raise AlreadyStarted("Lock refresh thread already started")
        return True

    def _nap(self, left: float | None) -> None:
        """Sleeps on the signal list (woken by any release, original or shim) until the
        holder's lease would end, `left` runs out or `_LONGEST_NAP` passes."""
        nap = _LONGEST_NAP
        pttl = self._client.pttl(self._name)
        if isinstance(pttl, int) and pttl >= 0:
            nap = min(nap, pttl / 1000)
        elif pttl == -2:
            return
        if left is not None:
            nap = min(nap, left)
        if nap <= 0:
            return
        self._client.blpop([self._signal], max(nap, 0.01))

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Takes the lock; True once acquired (False: non-blocking, or timed out)."""
        if self._held:
            raise AlreadyAcquired("Already acquired from this Lock instance.")
        if not blocking and timeout is not None:
            raise TimeoutNotUsable("Timeout cannot be used if blocking=False")
        seconds = 0.0
        if timeout:
            # The original's checks, in its whole seconds (so every timeout it takes is taken,
            # and int() refuses what it refuses); but it then waits int(timeout), which is 0,
            # "no timeout", for 0.5: we wait the given time.
            whole = int(timeout)
            seconds = float(timeout)
            if seconds < 0:
                raise InvalidTimeout(f"Timeout ({timeout}) cannot be less than or equal to 0")
            if self._expire and not self._lock_renewal_interval and whole > self._expire:
                raise TimeoutTooLarge(
                    f"Timeout ({whole}) cannot be greater than expire ({self._expire})"
                )
        deadline = time.monotonic() + seconds if seconds else None
        while True:
            if self._try():
                return True
            if not blocking:
                logger.warning("Failed to acquire Lock(%r).", self._name)
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return self._try()
            self._nap(left)

    def extend(self, expire: float | None = None) -> None:
        """Sets the lease to ``expire`` seconds (default: the lock's own) from now."""
        if expire:
            expire = _whole_seconds(expire)
        elif self._expire is not None:
            expire = self._expire
        else:
            raise TypeError(
                "To extend a lock 'expire' must be provided as an argument to extend() method "
                "or at initialization time."
            )
        if self._inherited():
            raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.")
        if renews(self._where) or (self._expire is None and self._hold is not None):
            # Held "without expiry" (a renewed lease here): the original cannot extend it.
            if not self._held:
                raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.")
            raise NotExpirable(f"Lock {self._name} has no assigned expiration time")
        ms = int(expire) * 1000
        if ms <= 0:  # an expiry of 0 would delete the lock
            raise ValueError(f"expire: must be at least 1 second, not {expire!r}")
        code = self._core.extend(token_text(self._id.encode(), "id"), ms, True)
        if code == -1:
            raise NotAcquired(f"Lock {self._name} is not acquired or it already expired.")
        if code == -2:
            raise NotExpirable(f"Lock {self._name} has no assigned expiration time")

    def release(self) -> None:
        """Releases the lock this instance holds (NotAcquired when it does not)."""
        if self._inherited():
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")
        with self._state:
            hold, self._hold = self._hold, None
        if hold is not None:
            hold.stop()
        stop_renewing(self._where)  # held without expiry, by whichever Lock with this id
        if not self._core.release(token_text(self._id.encode(), "id")):
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")

    def locked(self) -> bool:
        """Whether the lock is held (by anybody)."""
        return self._core.owner() is not None

    def __enter__(self) -> Self:
        acquired = self.acquire(blocking=self.blocking)
        if not acquired:
            if self.blocking:
                raise AssertionError(
                    f"Lock({self._name}) wasn't acquired, but blocking=True was used!"
                )
            raise NotAcquired(f"Lock({self._name}) is not acquired or it already expired.")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<redmutex.compat.redis_lock.Lock name={self._name!r} expire={self._expire!r}>"


def reset_all(redis_client: Any) -> None:
    """Forcibly deletes every `lock:*` lock, waking their waiters. Use this with care."""
    client = client_of(redis_client)
    server = server_of(client)
    for key in redis_client.scan_iter(match="lock:*", count=1000):
        raw = key if isinstance(key, bytes) else str(key).encode()
        name = raw.decode("utf-8", "backslashreplace")
        signal = b"lock-signal:" + raw[len(b"lock:") :]
        stop_renewing_key(server, raw)
        _CompatLock(client, name, raw, signal=signal, signal_expire_ms=1000).reset()
