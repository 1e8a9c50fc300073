"""redmutex: distributed locks, semaphores and a stampede-safe cache on Redis, with a Rust core."""

from __future__ import annotations

import atexit
import importlib
from typing import TYPE_CHECKING, Any

from . import _core, metrics
from ._cache import cached, get_or_fill
from ._core import Client, Lock, MultiLock, RWLock, RWLockSide, Semaphore, __version__
from ._recipes import acquire_lock, locked, redis_lock, release_lock
from ._types import ClientLike, RedisLike
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

if TYPE_CHECKING:
    from . import aio as aio

__all__ = [
    "Client",
    "ClientLike",
    "ConnectionError",
    "Lock",
    "LockError",
    "LockException",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "MultiLock",
    "QuorumError",
    "RWLock",
    "RWLockSide",
    "RedisLike",
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


def __getattr__(name: str) -> Any:
    # `redmutex.aio` without `import redmutex.aio`, imported on first use so that `import redmutex`
    # does not load asyncio.
    if name == "aio":
        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "aio"})
