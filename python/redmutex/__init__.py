"""redmutex: distributed locks, semaphores and a stampede-safe cache on Redis, with a Rust core."""

from __future__ import annotations

from ._core import Client, Lock, RWLock, Semaphore, __version__
from ._recipes import acquire_lock, locked, redis_lock, release_lock
from .errors import (
    ConnectionError,
    LockError,
    LockException,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    QuorumError,
)

__all__ = [
    "Client",
    "ConnectionError",
    "Lock",
    "LockError",
    "LockException",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "QuorumError",
    "RWLock",
    "Semaphore",
    "__version__",
    "acquire_lock",
    "locked",
    "redis_lock",
    "release_lock",
]
