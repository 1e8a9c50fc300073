"""The exceptions of redmutex. The Rust core raises these very classes (it imports them)."""

from __future__ import annotations

import builtins

__all__ = [
    "ConnectionError",
    "LockError",
    "LockException",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "QuorumError",
    "SemaphoreLimitError",
]


class LockError(Exception):
    """Base class of every redmutex error.

    ``name`` is the name of the lock, semaphore or RWLock the error is about (whole, even when
    the message shortens it), or None where no single name applies.
    """

    name: str | None

    def __init__(self, *args: object, name: str | None = None) -> None:
        super().__init__(*args)
        self.name = name


LockException = LockError


class LockTimeoutError(LockError, TimeoutError):
    """Not acquired within the timeout."""


class LockNotOwnedError(LockError):
    """release()/extend() of a hold this object does not have."""


class LockLostError(LockError):
    """The lease expired, or another owner took the lock, while we held it."""


class QuorumError(LockError):
    """Redlock: no majority of the masters answered."""


class SemaphoreLimitError(LockError):
    """A Semaphore acquire whose limit differs from the one its live holders or waiters use.

    The limit is kept with the semaphore in Redis; a new limit takes effect once no holder or
    waiter (fair or unfair) of the old one remains.
    """


class ConnectionError(LockError, builtins.ConnectionError):
    """Redis is unreachable (on a single server: still refusing connections, or loading its data,
    `connect_timeout` after the first refusal), or did not answer within the timeout."""
