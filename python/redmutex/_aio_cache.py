"""The stampede-safe cache for asyncio: ``redmutex.aio.get_or_fill`` and ``@redmutex.aio.cached``.

The same steps, keys, codecs and XFetch rule as ``redmutex._cache`` (read its docstring), from
the same code (``_decide`` and ``_flow``, driven here): only the Redis steps are awaited (the
Rust runtime does them, the event loop never blocks) and ``fill`` may be an ``async def`` or
return an awaitable. Of any number of tasks and processes that miss one entry, one runs
``fill``; the others wait without polling and are woken when the value is stored.

Cancellation: a task cancelled while it waits for another's fill leaves nothing behind; a task
cancelled while its own fill runs gives the claim back, so one waiting caller takes the fill over
(likewise a coroutine closed while its fill runs, and a fill raising GeneratorExit).
A ``fill`` that asks for its own entry (in its task, or in a task it started) raises
``RuntimeError`` instead of waiting for itself; once the fill has ended, a task it started
reads and fills the entry as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast, overload

from . import _aio_bridge, _core
from ._cache import (
    _SERVE,
    _Bound,
    _decide,
    _decorator,
    _Descriptor,
    _Driven,
    _Filling,
    _flow,
    _GiveBack,
    _own_entry_error,
    _own_fill_suspects,
    _Refetch,
    _RunFill,
    _Settings,
    _Store,
    _TryClaim,
)
from ._codec import Serializer

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._types import ClientLike

__all__ = ["AsyncBoundCachedFunction", "AsyncCachedFunction", "cached", "get_or_fill"]

P = ParamSpec("P")
T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)

# A fill may be an async function or a plain one (whose value may itself be awaitable).
Fill = Callable[[], Awaitable[T] | T]


class _FillMark:
    """One running fill (see ``_Filling``). Tasks the fill starts copy the context holding it,
    and ``reset`` undoes the mark only in the filler's own context: ``running`` is what the
    copies see end, so they are refused only while the fill they would wait for still runs."""

    __slots__ = ("fill", "running")

    def __init__(self, fill: _Filling) -> None:
        self.fill = fill
        self.running = True


# The fills running in this task or in the tasks it was started from, so that a fill asking for its
# own entry (directly or from a task it started) is refused instead of waiting for itself.
_filling: contextvars.ContextVar[tuple[_FillMark, ...]] = contextvars.ContextVar(
    "redmutex_aio_filling", default=()
)


class AsyncCachedFunction(Protocol[P, R_co]):
    """What ``@aio.cached`` returns: the coroutine function, plus an awaitable ``invalidate``."""

    __name__: str
    __qualname__: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]: ...

    async def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """Drops the cached value of that call (and any fill of it in progress); True when a
        value was dropped."""
        ...

    @overload
    def __get__(self, instance: None, owner: Any, /) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: Any, /) -> AsyncBoundCachedFunction[R_co]: ...


class AsyncBoundCachedFunction(Protocol[R_co]):
    """An ``@aio.cached`` method looked up on an instance (or a class, for a classmethod)."""

    __name__: str
    __qualname__: str

    def __call__(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, R_co]: ...

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool: ...


async def _coroutine_code() -> None:
    """Its code object marks our callables as coroutine functions for Python < 3.12."""


def _mark_coroutine_function(target: Any) -> None:
    """Makes ``inspect.iscoroutinefunction(target)`` true, as for the ``async def`` it wraps
    (frameworks look): ``markcoroutinefunction`` where Python has it (3.12+), else the
    function-like attributes that ``inspect`` reads."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:
        mark(target)
    else:
        target.__code__ = _coroutine_code.__code__
        target.__defaults__ = None
        target.__kwdefaults__ = None


class _AsyncBound(_Bound):
    """A bound ``@aio.cached`` method: its call returns the coroutine."""

    __slots__ = ()

    if not hasattr(inspect, "markcoroutinefunction"):
        __code__ = _coroutine_code.__code__
        __defaults__ = None
        __kwdefaults__ = None


def _mark_as_coroutine_function(cls: type, mark: Callable[[Any], Any]) -> None:
    """Python >= 3.12 marks a coroutine function with an attribute, which instances inherit
    from their class. ``markcoroutinefunction(cls)`` itself would set it on ``cls.__func__``
    (here the slot's descriptor, which refuses it), so a stand-in is marked and its mark
    copied."""

    def stand_in() -> None: ...

    before = set(vars(stand_in))
    mark(stand_in)
    for attr in set(vars(stand_in)) - before:
        setattr(cls, attr, getattr(stand_in, attr))


_markcoroutinefunction = getattr(inspect, "markcoroutinefunction", None)  # Python >= 3.12
if _markcoroutinefunction is not None:
    _mark_as_coroutine_function(_AsyncBound, _markcoroutinefunction)


class _AsyncCached(_Descriptor):
    """An ``@aio.cached`` function (see ``cached``)."""

    def __init__(
        self,
        func: Callable[..., Any],
        binding: str | None,
        settings: _Settings,
        key_of: Callable[[tuple[Any, ...], dict[str, Any]], str],
    ) -> None:
        super().__init__(func, binding, settings, key_of)
        _mark_coroutine_function(self)

    def __get__(self, instance: object, owner: Any = None) -> Any:
        bound = super().__get__(instance, owner)
        return _AsyncBound(bound.__func__, bound.__self__) if isinstance(bound, _Bound) else bound

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await _get(self._settings, *self._entry(args, kwargs))

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        return bool(await self._settings.store._invalidate_async(self._key_of(args, kwargs)))

    def __repr__(self) -> str:
        return f"<aio.cached {self.__qualname__}>"


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a background operation's outcome so asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()


def _own_fill_suspects_here(settings: _Settings, key: str) -> list[str]:
    """``_own_fill_suspects`` among the fills running in this task (or the one that started it)."""
    marks = _filling.get()
    if not marks:  # not inside a fill: the common case
        return []
    return _own_fill_suspects((m.fill for m in marks if m.running), settings, key)


async def _refuse_own_entry(settings: _Settings, key: str, suspects: list[str]) -> None:
    for token in suspects:
        if await settings.store._holds_claim_async(key, token):
            raise _own_entry_error(key)


async def _run_fill(settings: _Settings, key: str, fill: Fill[T], claim_token: str) -> T:
    mark = _FillMark(_Filling(settings.space, key, claim_token))
    # Ended marks inherited from a fill that started this task are dropped as we go.
    token = _filling.set((*(m for m in _filling.get() if m.running), mark))
    try:
        value = fill()
        if inspect.isawaitable(value):
            value = await value
        return cast(T, value)
    finally:
        mark.running = False  # for the tasks that copied the mark: this fill is over
        # A fill closed from outside its task (the garbage collector ending it after its loop
        # was closed) runs this in another context, where its token cannot be reset.
        with contextlib.suppress(ValueError):
            _filling.reset(token)


async def _give_back(request: _GiveBack) -> None:
    """After a cancellation the give-back runs on in the background rather than delaying the
    unwind (a failure there then goes unreported; the engine sends it again until Redis answers
    or the claim's lease ends). So it does after a GeneratorExit: it may be ``close()`` of this
    coroutine, which must not await."""
    pending = request.claim._abandon_async()
    if isinstance(request.error, (asyncio.CancelledError, GeneratorExit)):
        pending.add_done_callback(_consume)
        return
    await pending


def _on_this_loop(reply: Any) -> Any:
    """A lookup's reply; a fill claim it took is tied to the running loop, whose close gives it
    back (see `_aio_bridge.claimed_on_loop`)."""
    if isinstance(reply, _core.FillClaim):
        _aio_bridge.claimed_on_loop(asyncio.get_running_loop(), reply)
    return reply


async def _get(settings: _Settings, key: str, fill: Fill[T]) -> T:
    """One cache read: ``redmutex._cache._flow`` with awaited Redis steps."""
    suspects = _own_fill_suspects_here(settings, key)
    if suspects:
        await _refuse_own_entry(settings, key, suspects)
    store = settings.store
    decision = _decide(settings, key, _on_this_loop(await store._fetch_async(key)))
    if decision[0] is _SERVE:  # the hit path: no flow needed
        served: T = decision[1]
        return served
    flow = _Driven(_flow(settings, key, decision))
    reply: Any = None
    while not flow.done:
        request = flow.request
        try:
            if isinstance(request, _RunFill):
                reply = await _run_fill(settings, key, fill, request.token)
            elif isinstance(request, _Store):
                reply = await request.claim._store_async(request.payload)
            elif isinstance(request, _Refetch):
                fetched = store._fetch_async(key, request.skip, timeout=request.timeout)
                reply = _on_this_loop(await fetched)
            elif isinstance(request, _TryClaim):
                reply = _on_this_loop(await store._try_claim_async(key, request.seen))
            elif isinstance(request, _GiveBack):
                await _give_back(request)
                reply = None
        except BaseException as exc:  # noqa: BLE001 - the flow decides what each failure means
            flow.fail(exc)
        else:
            flow.send(reply)
    value: T = flow.result()
    return value


@overload
async def get_or_fill(
    client: ClientLike,
    key: str,
    fill: Callable[[], Awaitable[T]],
    *,
    ttl: float,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> T: ...
@overload
async def get_or_fill(
    client: ClientLike,
    key: str,
    fill: Callable[[], T],
    *,
    ttl: float,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> T: ...
async def get_or_fill(
    client: ClientLike,
    key: str,
    fill: Callable[[], Awaitable[T] | T],
    *,
    ttl: float,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> T:
    """The cached value of ``key``; on a miss exactly one caller awaits ``fill`` and stores it.

    ``redmutex.get_or_fill`` for asyncio, with the same options and errors: ``fill`` is an
    ``async def`` (or returns an awaitable; a plain value is used as it is). Waiting for another
    caller's fill never blocks the event loop.
    """
    if not callable(fill):
        raise TypeError(f"fill: expected a callable, not {type(fill).__name__}")
    settings = _Settings(client, ttl, lock_ttl, timeout, serializer, secret, beta)
    return await _get(settings, key, fill)


def cached(
    client: ClientLike,
    *,
    ttl: float,
    key: str | Callable[..., str] | None = None,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> Callable[[Callable[P, Awaitable[T]]], AsyncCachedFunction[P, T]]:
    """Decorator for ``async def`` functions: ``aio.get_or_fill`` for every call, with the same
    options (checked here, at decoration time) and the same ``key`` rules as
    ``redmutex.cached`` (a key function may be a plain callable; on a method ``self``/``cls`` is
    left out of derived keys). ``await fetch.invalidate(*args, **kwargs)`` drops that call's
    value; on a method, ``await obj.load.invalidate(5)`` passes the instance first."""
    settings = _Settings(client, ttl, lock_ttl, timeout, serializer, secret, beta)
    decorate: Callable[[Callable[P, Awaitable[T]]], AsyncCachedFunction[P, T]]
    decorate = _decorator(settings, key, _AsyncCached, "@aio.cached")
    return decorate
