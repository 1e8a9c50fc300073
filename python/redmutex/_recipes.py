"""The classic recipe (Redis in Action): acquire_lock / release_lock / redis_lock, and @locked.

The book's functions keep their names, arguments and results, so code written for them runs
unchanged; underneath they use redmutex's atomic scripts and wait without polling.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, ParamSpec, TypeVar

from . import _core, metrics
from ._callkeys import compile_template
from .errors import LockError, LockLostError

P = ParamSpec("P")
R = TypeVar("R")


def _shown(name: str) -> str:
    """`name` quoted for a message, cut after 200 characters (a name may be megabytes)."""
    return f"'{name[:200]}…'" if len(name) > 200 else f"'{name}'"


def acquire_lock(
    conn: Any,
    lockname: str,
    identifier: str | None = None,
    atime: float = 10,
    ltime: float = 10,
) -> str | Literal[False]:
    """Take `lockname` for up to `atime` seconds with a lease of `ltime` seconds.

    Returns the identifier (a fresh random one unless given), or False if not acquired in time.
    """
    if identifier is None:
        identifier = secrets.token_hex(16)
    if metrics._active is None:
        fence = _core.acquire_token(conn, lockname, identifier, atime, ltime)
        return identifier if fence is not None else False
    started = time.perf_counter()
    try:
        fence = _core.acquire_token(conn, lockname, identifier, atime, ltime)
    except BaseException:
        metrics.recipe_acquired(lockname, identifier, started, False)
        raise
    metrics.recipe_acquired(lockname, identifier, started, fence is not None)
    return identifier if fence is not None else False


def release_lock(conn: Any, lockname: str, identifier: str) -> bool:
    """Release `lockname` if `identifier` holds it; False means "we lost the lock"."""
    released = bool(_core.release_token(conn, lockname, identifier))
    if metrics._active is not None:
        metrics.recipe_released(lockname, identifier, released)
    return released


@contextmanager
def redis_lock(conn: Any, lockname: str, atime: float = 10, ltime: float = 10) -> Iterator[str]:
    """`with redis_lock(conn, name) as identifier:` — raises LockError("could not acquire lock")
    when not acquired within `atime`, and LockLostError("lock was lost") on leaving if the lease
    ended meanwhile; both say the lock's name and carry it as `.name`."""
    identifier = acquire_lock(conn, lockname, atime=atime, ltime=ltime)
    if not identifier:
        raise LockError(f"lock {_shown(lockname)}: could not acquire lock", name=lockname)
    try:
        yield identifier
    finally:
        if not release_lock(conn, lockname, identifier):
            raise LockLostError(f"lock {_shown(lockname)}: lock was lost", name=lockname)


def locked(
    client: Any,
    name: str,
    *,
    ttl: float = 10.0,
    timeout: float | None = None,
    auto_renew: bool = False,
    fair: bool = False,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: run the function holding the lock `name`, whose `{param}` placeholders are
    filled from each call's arguments (`"lock:{sender}"`). Each call uses its own Lock object."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, not {type(name).__name__}")
    # Validate the options once, at decoration time, with a throwaway object.
    _core.Lock(client, name or "_", ttl=ttl, timeout=timeout, auto_renew=auto_renew, fair=fair)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        lock_name = compile_template(name, func)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            lock = _core.Lock(
                client,
                lock_name(args, kwargs),
                ttl=ttl,
                timeout=timeout,
                auto_renew=auto_renew,
                fair=fair,
            )
            if metrics._active is None:
                with lock:
                    return func(*args, **kwargs)
            with metrics.measured(lock):
                return func(*args, **kwargs)

        return wrapper

    return decorate
