"""redmutex for asyncio: the same primitives with coroutine methods and `async with`.

Every wait happens in the Rust runtime, so a waiting coroutine never blocks the event loop.
Ownership belongs to the lock object (not to a thread or task). A cancelled `acquire()` neither
keeps nor later takes the lock: the Rust side stops and cleans up, and a grant that raced the
cancellation is given back.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _core
from ._callkeys import compile_template

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Lock", "locked"]

P = ParamSpec("P")
R = TypeVar("R")


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a background operation's outcome so asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()


class Lock:
    """`redmutex.Lock` for asyncio: `await lock.acquire()`, `async with lock: ...`."""

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        fair: bool = False,
        replicas: int = 0,
        on_lost: Callable[[Lock], None] | None = None,
    ) -> None:
        core_on_lost = None
        if on_lost is not None:
            if not callable(on_lost):
                raise TypeError("on_lost: expected a callable")
            this = weakref.ref(self)

            def core_on_lost(_core_lock: _core.Lock) -> None:
                me = this()
                if me is not None:
                    on_lost(me)

        self._lock = _core.Lock(
            client,
            name,
            ttl=ttl,
            timeout=timeout,
            auto_renew=auto_renew,
            fair=fair,
            replicas=replicas,
            on_lost=core_on_lost,
        )

    def _give_back_after_cancel(self) -> None:
        # A grant that raced the cancellation belongs to nobody: give it back in the background.
        if self._lock.token is not None:
            self._lock._release_async().add_done_callback(_consume)

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        try:
            return bool(await self._lock._acquire_async(blocking, timeout))
        except asyncio.CancelledError:
            self._give_back_after_cancel()
            raise

    async def release(self) -> None:
        await self._lock._release_async()

    async def extend(self, ttl: float | None = None) -> None:
        await self._lock._extend_async(ttl)

    async def locked(self) -> bool:
        return bool(await self._lock._locked_async())

    async def owned(self) -> bool:
        return bool(await self._lock._owned_async())

    def remaining(self) -> float | None:
        return self._lock.remaining()

    @property
    def token(self) -> str | None:
        return self._lock.token

    @property
    def fence(self) -> int | None:
        return self._lock.fence

    @property
    def lost(self) -> bool:
        return self._lock.lost

    @property
    def name(self) -> str:
        return self._lock.name

    async def __aenter__(self) -> Self:
        try:
            await self._lock._enter_async()
        except asyncio.CancelledError:
            self._give_back_after_cancel()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(await self._lock._exit_async(exc_type is not None))

    def __repr__(self) -> str:
        return f"aio.{self._lock!r}"


def locked(
    client: Any,
    name: str,
    *,
    ttl: float = 10.0,
    timeout: float | None = None,
    auto_renew: bool = False,
    fair: bool = False,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorator for `async def`: run it holding the lock `name` (`{param}` from the call)."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, not {type(name).__name__}")
    _core.Lock(client, name or "_", ttl=ttl, timeout=timeout, auto_renew=auto_renew, fair=fair)

    def decorate(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        lock_name = compile_template(name, func)

        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            lock = Lock(
                client,
                lock_name(args, kwargs),
                ttl=ttl,
                timeout=timeout,
                auto_renew=auto_renew,
                fair=fair,
            )
            async with lock:
                return await func(*args, **kwargs)

        return wrapper

    return decorate
