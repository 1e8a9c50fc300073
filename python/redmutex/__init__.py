"""redmutex: distributed locks, semaphores and a stampede-safe cache on Redis, with a Rust core."""

from __future__ import annotations

import atexit

from . import _core, metrics
from ._cache import cached, get_or_fill
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
    SemaphoreLimitError,
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
    "SemaphoreLimitError",
    "__version__",
    "acquire_lock",
    "cached",
    "get_or_fill",
    "locked",
    "metrics",
    "redis_lock",
    "release_lock",
]

# Background threads of the core must not call into Python once the interpreter shuts down.
atexit.register(_core._interpreter_exiting)
