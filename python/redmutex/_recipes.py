"""The classic recipe (Redis in Action): acquire_lock / release_lock / redis_lock, and @locked.

The book's functions keep their names, arguments and results, so code written for them runs
unchanged; underneath they use redmutex's atomic scripts and wait without polling.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import secrets
import time
import types
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterator,
)
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, cast, final, overload

from . import _core, metrics
from ._callkeys import compile_template
from .errors import LockError, LockLostError

if TYPE_CHECKING:
    from ._types import ClientLike

P = ParamSpec("P")
R = TypeVar("R")

_log = logging.getLogger("redmutex")
# What a plain function must not return under @locked (its body would run unlocked, later).
_LATER_RESULTS = (types.CoroutineType, types.AsyncGeneratorType, types.GeneratorType)


def _generate() -> Iterator[None]:
    yield


async def _agenerate() -> AsyncIterator[None]:
    yield


# Every function that @contextmanager / @asynccontextmanager makes runs one shared helper code:
# what it returns runs the decorated body later, on entering, after a lock around the call ended.
_CONTEXT_MANAGER_CODES = {
    contextmanager(_generate).__code__: "@contextlib.contextmanager",
    asynccontextmanager(_agenerate).__code__: "@contextlib.asynccontextmanager",
}


def _shown(name: str) -> str:
    """`name` quoted for a message, cut after 200 characters (a name may be megabytes)."""
    return f"'{name[:200]}…'" if len(name) > 200 else f"'{name}'"


def acquire_lock(
    conn: ClientLike,
    lockname: str,
    identifier: str | None = None,
    atime: float = 10,
    ltime: float = 10,
) -> str | Literal[False]:
    """Take `lockname` for up to `atime` seconds with a lease of `ltime` seconds.

    Returns the identifier (a fresh random one unless given), or False if not acquired in time.
    Two calls with the same `identifier` never hold the lock at once. Without an `identifier`,
    an attempt whose outcome is unknown (its reply lost or late, or the call interrupted) that
    raised is given back in the background: the identifier drawn for it is nobody else's. One
    with a given `identifier` may leave the lock held for it until `ltime` ends: it is not
    deleted by identifier, as another call may hold it.
    """
    drawn = identifier is None
    if identifier is None:
        identifier = secrets.token_hex(16)
    if metrics._active is None:
        fence = _core.acquire_token(conn, lockname, identifier, atime, ltime, drawn=drawn)
        return identifier if fence is not None else False
    started = time.perf_counter()
    try:
        fence = _core.acquire_token(conn, lockname, identifier, atime, ltime, drawn=drawn)
    except BaseException:
        metrics.recipe_acquired(lockname, identifier, started, False)
        raise
    try:
        metrics.recipe_acquired(lockname, identifier, started, fence is not None)
    except BaseException:
        # The hook was interrupted (Ctrl-C, SystemExit): the caller never gets the identifier
        # to release with, so the hold is released here.
        if fence is not None:
            with suppress(Exception):
                _core.release_token(conn, lockname, identifier)
        raise
    return identifier if fence is not None else False


def release_lock(conn: ClientLike, lockname: str, identifier: str) -> bool:
    """Release `lockname` if `identifier` holds it; False means "we lost the lock".

    A release whose connection dropped is resent only for a hold this process took (with this
    client): the resend deletes that hold alone (with a Redlock client, on each master the grant
    of this client's own vote), never one another call took since under the same identifier.
    Otherwise it raises ConnectionError (with a Redlock client, QuorumError when too few masters
    answered; the delete may have run; a hold left in place lapses after its `ltime`).
    """
    released = bool(_core.release_token(conn, lockname, identifier))
    if metrics._active is not None:
        metrics.recipe_released(lockname, identifier, released)
    return released


def redis_lock(
    conn: ClientLike, lockname: str, atime: float = 10, ltime: float = 10
) -> RedisLockBlock:
    """`with redis_lock(conn, name) as identifier:` — raises LockError("could not acquire lock")
    when not acquired within `atime`, and LockLostError("lock was lost") on leaving if the lease
    ended meanwhile; both say the lock's name and carry it as `.name`. As with `with Lock`: when
    the block itself raised, its exception propagates and a loss (or a failed release) is logged
    as a WARNING on the `redmutex` logger.

    Like any ``@contextmanager`` object it also decorates a function (each call holds the lock),
    with ``@redmutex.locked``'s rules: a generator function holds it across the iteration, and
    an ``async def``, an async generator or a ``@contextmanager`` function is refused with
    ``TypeError``, as its body would run after the release."""
    return RedisLockBlock(conn, lockname, atime, ltime)


class RedisLockBlock:
    """What ``redis_lock(...)`` returns: one ``with`` block (its identifier bound by ``as``), or
    a decorator whose every call holds the lock in a block of its own."""

    __slots__ = ("_args", "_block")

    def __init__(self, conn: ClientLike, lockname: str, atime: float, ltime: float) -> None:
        self._args = (conn, lockname, atime, ltime)
        self._block = _redis_lock_block(conn, lockname, atime, ltime)

    def __enter__(self) -> str:
        return self._block.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> bool | None:
        return self._block.__exit__(exc_type, exc, tb)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        # contextlib's ContextDecorator would wrap an async def or a generator function in a
        # plain call: the lock released before the body runs. These are @locked's rules.
        label = "@redmutex.redis_lock(...)"
        _refuse_async(func, label)
        _refuse_context_manager(func, label)
        args = self._args
        if _is_generator_function(func):
            generate = cast(Callable[..., Generator[Any, Any, Any]], func)

            @functools.wraps(func)
            def iterate(*a: Any, **kw: Any) -> Generator[Any, Any, Any]:
                with _redis_lock_block(*args):
                    return (yield from generate(*a, **kw))

            return cast(Callable[P, R], iterate)

        @functools.wraps(func)
        def wrapper(*a: P.args, **kw: P.kwargs) -> R:
            with _redis_lock_block(*args):
                result = func(*a, **kw)
            if type(result) in _LATER_RESULTS:
                _refuse_later_result(func, result, label)
            return result

        return wrapper


@contextmanager
def _redis_lock_block(
    conn: ClientLike, lockname: str, atime: float = 10, ltime: float = 10
) -> Iterator[str]:
    """One ``with redis_lock(...)`` block."""
    identifier = acquire_lock(conn, lockname, atime=atime, ltime=ltime)
    if not identifier:
        raise LockError(f"lock {_shown(lockname)}: could not acquire lock", name=lockname)
    holder = os.getpid()
    try:
        yield identifier
    except BaseException:
        # A forked child leaving the block (sys.exit, an exception) holds none of the parent's
        # locks: the parent, still inside, keeps its lock.
        if os.getpid() == holder:
            _release_after_raise(conn, lockname, identifier)
        raise
    if os.getpid() != holder:
        return
    if not release_lock(conn, lockname, identifier):
        raise LockLostError(f"lock {_shown(lockname)}: lock was lost", name=lockname)


def _release_after_raise(conn: ClientLike, lockname: str, identifier: str) -> None:
    """Releases after the block raised; never replaces the block's exception."""
    try:
        released = release_lock(conn, lockname, identifier)
    except Exception as exc:  # noqa: BLE001 - logged: the block's exception goes on
        _log.warning("redis_lock %r: on leaving a block that raised: %s", lockname, exc)
        return
    if not released:
        _log.warning("redis_lock %r: on leaving a block that raised: lock was lost", lockname)


@final
class UseAioLocked:
    """What a type checker sees `@redmutex.locked` make of an ``async def`` or an async
    generator function: nothing callable, so every call is flagged. (At run time the decorator
    raises ``TypeError`` instead.) Decorate coroutine functions with ``redmutex.aio.locked``."""


class LockedDecorator(Protocol):
    """What ``locked(...)`` returns. The overloads for async callables exist only to make type
    checkers flag them; at run time they raise ``TypeError``."""

    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, func: Callable[P, Coroutine[Any, Any, Any]]
    ) -> UseAioLocked: ...
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, func: Callable[P, AsyncIterator[Any]]
    ) -> UseAioLocked: ...
    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R]: ...


AG = TypeVar("AG", bound=AsyncIterator[Any])


class AioLockedDecorator(Protocol):
    """What ``redmutex.aio.locked(...)`` returns: it takes an ``async def`` or an async
    generator function (a plain function is refused with ``TypeError``)."""

    @overload
    def __call__(self, func: Callable[P, AG]) -> Callable[P, AG]: ...
    @overload
    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...


def _refuse_async(func: Callable[..., Any], label: str = "@redmutex.locked") -> None:
    """``@locked`` around a coroutine would hold the lock only while the coroutine object is
    created, not while it runs: no exclusion at all. Refused, pointing to the asyncio decorator."""
    call = inspect.getattr_static(type(func), "__call__", None)  # `async def __call__`
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call):
        what = "an async function"
    elif inspect.isasyncgenfunction(func) or inspect.isasyncgenfunction(call):
        what = "an async generator function"
    else:
        return
    raise TypeError(
        f"{label}: {getattr(func, '__qualname__', func)!r} is {what}; a blocking lock "
        "around it would be released before its body runs. Use @redmutex.aio.locked"
    )


def _refuse_later_result(
    func: Callable[..., Any], result: object, label: str = "@redmutex.locked"
) -> None:
    """A plain function that returned a coroutine, an async generator or an unstarted generator
    (a wrapper around a generator function, a generator expression): its body runs later,
    unlocked. The result is closed unrun and the call refused."""
    if inspect.isgenerator(result):
        if inspect.getgeneratorstate(result) != inspect.GEN_CREATED:
            return  # ran (or finished) under the lock: the function's own business
        result.close()
        raise TypeError(
            f"{label}: {getattr(func, '__qualname__', func)!r} returned a generator "
            "that had not started, whose body would run after the lock was released; put "
            f"{label} directly on the generator function (it then holds the lock across the "
            "iteration), or return a list"
        )
    if inspect.iscoroutine(result) or inspect.isasyncgen(result):
        if inspect.iscoroutine(result):
            result.close()  # unrun: no "never awaited" warning
        raise TypeError(
            f"{label}: {getattr(func, '__qualname__', func)!r} returned "
            f"{type(result).__name__} object, which would run after the lock was released; "
            "use @redmutex.aio.locked on an async def"
        )


def _is_generator_function(func: Callable[..., Any]) -> bool:
    """A generator function, or an object whose ``__call__`` is one."""
    call = inspect.getattr_static(type(func), "__call__", None)
    return inspect.isgeneratorfunction(func) or inspect.isgeneratorfunction(call)


def _refuse_context_manager(func: Callable[..., Any], label: str) -> None:
    """A ``@contextmanager`` function returns a context manager whose body runs when it is
    entered, after a lock around the call was released: refused, pointing to the order that
    works (the generator function under the lock holds it from entering to leaving)."""
    maker = _CONTEXT_MANAGER_CODES.get(getattr(func, "__code__", None))  # type: ignore[arg-type]
    if maker is not None:
        raise TypeError(
            f"{label}: {getattr(func, '__qualname__', func)!r} is a {maker} function; a lock "
            f"around the call would be released before its body runs. Put {label} under "
            f"{maker} (then the lock is held from entering the block to leaving it)"
        )


def lock_decorator(
    client: ClientLike,
    name: str,
    make_lock: Callable[..., Any],
    wrap: Callable[[Callable[..., Any], Callable[[tuple[Any, ...], dict[str, Any]], Any]], Any],
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """What ``locked`` and ``redmutex.aio.locked`` share: the name's template, the options
    checked once at decoration time, and a new lock object (``make_lock``: ``Lock`` or
    ``aio.Lock``) for each call; ``wrap(func, new_lock)`` makes the wrapper."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name: must not be empty")
    # Validate the options once, at decoration time, with a throwaway object.
    _core.Lock(client, name, **options)

    def decorate(func: Callable[..., Any]) -> Any:
        lock_name = compile_template(name, func, argument="name")

        def new_lock(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return make_lock(client, lock_name(args, kwargs), **options)

        return wrap(func, new_lock)

    return decorate


def _wrap_blocking(
    func: Callable[..., Any], new_lock: Callable[[tuple[Any, ...], dict[str, Any]], Any]
) -> Callable[..., Any]:
    """The wrapper of ``@locked``: each call (or a generator's whole iteration) holds a lock
    of its own, measured when metrics hooks are set."""
    _refuse_async(func)
    _refuse_context_manager(func, "@redmutex.locked")
    if _is_generator_function(func):
        generate = cast(Callable[..., Generator[Any, Any, Any]], func)

        @functools.wraps(func)
        def iterate(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            lock = new_lock(args, kwargs)
            with lock if metrics._active is None else metrics.measured(lock):
                return (yield from generate(*args, **kwargs))

        return iterate

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        lock = new_lock(args, kwargs)
        if metrics._active is None:
            with lock:
                result = func(*args, **kwargs)
        else:
            with metrics.measured(lock):
                result = func(*args, **kwargs)
        if type(result) in _LATER_RESULTS:
            _refuse_later_result(func, result)
        return result

    return wrapper


def _async_kind(func: Callable[..., Any]) -> str | None:
    """What ``@redmutex.aio.locked`` makes of ``func``: "coroutine", "async generator", or None
    for a plain (or generator) function. An ``async def __call__`` counts, and so does a plain
    wrapper whose ``__wrapped__`` chain (``functools.wraps``) ends in an async function."""
    candidates: list[Any] = [func, inspect.getattr_static(type(func), "__call__", None)]
    try:
        candidates.append(inspect.unwrap(func))
    except ValueError:  # a __wrapped__ cycle: judged by func alone
        pass
    for candidate in candidates:
        if inspect.isasyncgenfunction(candidate):
            return "async generator"
        if inspect.iscoroutinefunction(candidate):
            return "coroutine"
    return None


def _refuse_sync(func: Callable[..., Any]) -> None:
    """``@redmutex.aio.locked`` around a plain function would run its body holding the lock and
    then fail to await the result: refused at decoration, pointing to the blocking decorator."""
    what = "a generator function" if inspect.isgeneratorfunction(func) else "not async"
    raise TypeError(
        f"@redmutex.aio.locked: {getattr(func, '__qualname__', func)!r} is {what}; "
        "decorate an async def or async generator function, or use @redmutex.locked"
    )


def wrap_async(
    func: Callable[..., Any],
    new_lock: Callable[[tuple[Any, ...], dict[str, Any]], Any],
) -> Callable[..., Any]:
    """The wrapper of ``@redmutex.aio.locked``: each call (or an async generator's whole
    iteration) holds an ``aio.Lock`` of its own, measured when metrics hooks are set."""
    _refuse_context_manager(func, "@redmutex.aio.locked")
    kind = _async_kind(func)
    if kind is None:
        _refuse_sync(func)
    if kind == "async generator":
        generate = cast(Callable[..., AsyncGenerator[Any, Any]], func)

        @functools.wraps(func)
        async def iterate(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            lock = new_lock(args, kwargs)
            async with lock if metrics._active is None else metrics.measured(lock):
                inner = generate(*args, **kwargs)
                try:
                    # `yield from` for async generators: values out; asend() and athrow() in.
                    step: Awaitable[Any] = inner.__anext__()
                    while True:
                        try:
                            value = await step
                        except StopAsyncIteration:
                            return
                        try:
                            sent = yield value
                        except GeneratorExit:
                            raise  # aclose(): the finally closes the body
                        except BaseException as exc:  # noqa: BLE001 - athrow(): to the body
                            step = inner.athrow(exc)
                        else:
                            step = inner.__anext__() if sent is None else inner.asend(sent)
                finally:
                    await inner.aclose()

        return iterate

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        lock = new_lock(args, kwargs)
        async with lock if metrics._active is None else metrics.measured(lock):
            return await func(*args, **kwargs)

    return wrapper


def locked(
    client: ClientLike,
    name: str,
    *,
    ttl: float = 10.0,
    timeout: float | None = None,
    auto_renew: bool = False,
    fair: bool = False,
) -> LockedDecorator:
    """Decorator: run the function holding the lock `name`, whose `{param}` placeholders are
    filled from each call's arguments (`"lock:{sender}"`, with ``str()``). Each call uses its own
    Lock object. A value whose ``str()`` is its address (its class defines neither ``__str__``
    nor ``__repr__``) raises ``TypeError``: it would name another lock for every object and
    process, so calls about one thing would not exclude each other; use ``{param.attr}``.

    A generator function (or an object whose ``__call__`` is one) holds the lock from its first
    ``next()`` until it finishes, raises or is closed (so close a generator you stop iterating
    early, e.g. with ``contextlib.closing``). A call that returns a generator that has not
    started (a plain wrapper around a generator function, a generator expression) raises
    ``TypeError``, as its body would run after the release. An ``async def`` or async generator
    function is refused with ``TypeError``: use ``redmutex.aio.locked``; so is a
    ``@contextlib.contextmanager`` function: put ``@locked`` under ``@contextmanager``."""
    decorate = lock_decorator(
        client,
        name,
        _core.Lock,
        _wrap_blocking,
        ttl=ttl,
        timeout=timeout,
        auto_renew=auto_renew,
        fair=fair,
    )
    return cast(LockedDecorator, decorate)
