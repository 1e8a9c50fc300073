"""redmutex for asyncio: the same primitives with coroutine methods and `async with`.

Every wait happens in the Rust runtime, so a waiting coroutine never blocks the event loop. On
one server the one-round-trip calls (a first acquire attempt, release, extend, owned) go out on
the event loop's own connection instead (`_core.LoopConn`), with no thread hand-off.
Ownership belongs to the lock object (not to a thread or task). A cancelled `acquire()` neither
keeps nor later takes the lock: the Rust side stops and cleans up, and a grant that raced the
cancellation is given back.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import sys
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, SupportsIndex, cast

from . import _aio_bridge, _core
from ._aio_cache import AsyncCachedFunction, cached, get_or_fill
from ._recipes import AioLockedDecorator, lock_decorator, wrap_async

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._types import ClientLike

__all__ = [
    "AsyncCachedFunction",
    "Lock",
    "MultiLock",
    "RWLock",
    "RWLockSide",
    "Semaphore",
    "cached",
    "get_or_fill",
    "locked",
]


def _refuse_copy(obj: object) -> NoReturn:
    """Like the core objects (and ``threading.Lock``): a copy or an unpickled twin would share
    the object's hold, so two objects would each believe they hold the lock, and either could
    release it."""
    kind = type(obj)
    raise TypeError(f"cannot pickle '{kind.__module__}.{kind.__qualname__}' object")


def _relay_on_lost(on_lost: Callable[[Any], None] | None, owner: Any) -> Any:
    """An on_lost for the core object that calls the user's with the asyncio object (held
    weakly, so renewal never keeps it alive)."""
    if on_lost is None:
        return None
    if not callable(on_lost):
        raise TypeError("on_lost: expected a callable")
    this = weakref.ref(owner)

    def relay(_core_object: Any) -> None:
        me = this()
        if me is not None:
            on_lost(me)

    return relay


class _Hold:
    """What Lock, Semaphore and the read/write locks share: coroutine acquire/release/extend/
    owned and `async with`, over a core object's `_*_async` methods."""

    _core: Any
    #: Whether a hold renews its lease in the background (see `_taken`).
    _auto_renew: bool = False

    def _context(self) -> tuple[Any, ...]:
        return ()

    def _taken(self, core: Any) -> None:
        """`core` took a hold on the running loop: an auto-renewed one stops renewing when that
        loop is closed (its owner gone, the lease then runs out within the ttl)."""
        if self._auto_renew:
            token = core.token
            if token is not None:
                _aio_bridge.renewed_on_loop(asyncio.get_running_loop(), core, token)

    def _give_back_after_cancel(self, attempt: asyncio.Future[Any]) -> None:
        # A cancelled attempt gives back whatever it obtains, now or as it settles: through the
        # runtime its awaitable tells the engine; on the loop path this call does (no
        # done-callback per acquire). Left: the attempt had succeeded (its awaitable resolved)
        # but this task was cancelled before it resumed: that hold belongs to nobody.
        if attempt.cancelled():
            _core._loop_cancelled(attempt)
            return
        if not attempt.done() or attempt.exception() is not None:
            return
        token = self._core.token
        if attempt.result() is not False and token is not None:
            self._core._give_back(token)

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Takes it; True when acquired, False when the wait ended first. `blocking=False`
        tries once; `timeout=None` means the constructor's timeout (whose default None waits
        forever), `math.inf` forever, 0 once. Never blocks the event loop."""
        core = self._core
        attempt = core._acquire_async(*self._context(), blocking, timeout)
        try:
            acquired = bool(await attempt)
        except asyncio.CancelledError:
            self._give_back_after_cancel(attempt)
            raise
        if acquired:
            self._taken(core)
        return acquired

    async def release(self) -> None:
        """Releases the hold (LockNotOwnedError when none, LockLostError when it was lost).
        Cancelled while its command is out, the release still goes on, and the object holds
        nothing from then on (its next acquire waits, if need be, for that release)."""
        core = self._core
        releasing = core._release_async()
        try:
            await releasing
        except asyncio.CancelledError:
            core._release_abandoned()
            raise

    async def extend(self, ttl: float | None = None) -> None:
        """The lease now ends `ttl` seconds from now (None: the object's own ttl)."""
        core = self._core
        await core._extend_async(ttl)
        # A renewal extend already on its way may have run after this one in Redis; renewal
        # then extends again at once (a round trip). Returns once it did, as the blocking
        # extend does, so that the lease asked for is the one in Redis.
        if core._extend_settling():
            loop = asyncio.get_running_loop()
            until = loop.time() + _EXTEND_SETTLE_LIMIT
            while core._extend_settling() and loop.time() < until:
                await asyncio.sleep(0.001)

    async def owned(self) -> bool:
        """True when this object holds it, checked against Redis."""
        return bool(await self._core._owned_async())

    def remaining(self) -> float | None:
        """Seconds left on this object's lease; None when not held."""
        value: float | None = self._core.remaining()
        return value

    @property
    def token(self) -> str | None:
        """The owner identifier of the current hold, None when not held."""
        value: str | None = self._core.token
        return value

    @property
    def lost(self) -> bool:
        """True once this hold was found lost."""
        return bool(self._core.lost)

    @property
    def name(self) -> str:
        """The name in Redis."""
        return str(self._core.name)

    async def __aenter__(self) -> Self:
        """Acquires with the constructor's timeout; LockTimeoutError when not acquired."""
        core = self._core
        attempt = core._enter_async(*self._context())
        try:
            await attempt
        except asyncio.CancelledError:
            self._give_back_after_cancel(attempt)
            raise
        self._taken(core)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Never swallows the block's exception (so `-> None`: type checkers then know that code
        # after an `async with` whose block returns is unreachable). Cancelled, the release goes
        # on, as in `release()`.
        core = self._core
        leaving = core._exit_async(exc_type is not None)
        try:
            await leaving
        except asyncio.CancelledError:
            core._release_abandoned()
            raise

    def __repr__(self) -> str:
        return f"aio.{self._core!r}"

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # pickle, copy.copy and copy.deepcopy all come here.
        _refuse_copy(self)


#: Every re-entrant aio.Lock's core of each task, by (client, name): the owner is the task, so
#: a task that holds a name through one object re-enters that hold through any other of the same
#: client and name (as `redmutex.Lock` does for threads). Dropped with the task.
_task_cores: weakref.WeakKeyDictionary[
    asyncio.Task[Any], dict[tuple[int, str], list[weakref.ref[Any]]]
] = weakref.WeakKeyDictionary()


def _running_task() -> asyncio.Task[Any] | None:
    """The calling task; None outside one, also outside any running loop (where
    `asyncio.current_task()` raises): `token` and the other plain properties work there too."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _holding_core(task: asyncio.Task[Any], key: tuple[int, str]) -> Any | None:
    """The core through which `task` itself holds `key` now, if any (only looks)."""
    for ref in _task_cores.get(task, {}).get(key, ()):
        core = ref()
        if core is not None and core.token is not None:
            return core
    return None


def _held_by_task(task: asyncio.Task[Any], key: tuple[int, str], core: Any | None) -> Any:
    """The core through which `task` holds `key` now, another object's or `core` (which is
    listed for the others; None: only look)."""
    cores = _task_cores.setdefault(task, {}).setdefault(key, [])
    live = [c for c in (ref() for ref in cores) if c is not None]
    if core is not None and not any(c is core for c in live):
        live.append(core)
    cores[:] = [weakref.ref(c) for c in live]
    return next((c for c in live if c.token is not None), core)


class Lock(_Hold):
    """`redmutex.Lock` for asyncio: `await lock.acquire()`, `async with lock: ...`.

    Same arguments and defaults as `redmutex.Lock` (`ttl=10.0`; `timeout=None` waits forever).
    With `reentrant=True` the owner is the asyncio task: the task that holds may acquire again
    (one release per acquire), through this object or any other re-entrant aio.Lock of the same
    client and name; another task waits like any other waiter. The task that
    `asyncio.wait_for` makes for its awaitable before Python 3.12 counts as the task that awaits
    it; tasks made by `create_task`, `gather` or `shield` are other owners. (Before 3.12 a task
    passed to `wait_for` looks the same as one `wait_for` made: while it holds nothing, it acts
    for the task that awaits it. Once it holds, it acts on its own hold.)
    """

    def __init__(
        self,
        client: ClientLike,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        fair: bool = False,
        replicas: int = 0,
        on_lost: Callable[[Lock], None] | None = None,
        reentrant: bool = False,
    ) -> None:
        def make() -> Any:
            return _core.Lock(
                client,
                name,
                ttl=ttl,
                timeout=timeout,
                auto_renew=auto_renew,
                fair=fair,
                replicas=replicas,
                on_lost=_relay_on_lost(on_lost, self),
                reentrant=reentrant,
            )

        self._own = make()
        self._auto_renew = bool(auto_renew)
        # Re-entrant: one core object per task (each re-entrant for the event loop's thread),
        # dropped with its task; `_own` serves calls made outside any task.
        self._make = make
        self._key = (id(self._own.client), name)
        self._by_task: weakref.WeakKeyDictionary[asyncio.Task[Any], Any] | None = (
            weakref.WeakKeyDictionary() if self._own.reentrant else None
        )

    @property
    def _core(self) -> Any:
        """The core object the calling task acts on (see `reentrant`)."""
        if self._by_task is None:
            return self._own
        task = asyncio.current_task()
        if task is None:
            return self._own
        own = self._by_task.get(task)
        if own is not None and own.token is not None:
            # A task acts on its own hold, also once its caller awaits it through `wait_for`
            # (which would otherwise file it under that caller, see `_guarded_task`), and also
            # through another object of the same client and name.
            return own
        held = _holding_core(task, self._key)
        if held is not None:
            return held
        task = _guarded_task(task)
        core = self._by_task.get(task)
        if core is None:
            core = self._by_task[task] = self._make()
        if core.token is not None:
            return core
        return _held_by_task(task, self._key, core)

    def _shown(self) -> Any:
        """What `token`, `fence`, `lost` and `remaining()` describe: the calling task's hold (or
        the loss of its last one), also through another object, else the hold another task
        has, else a lost one."""
        if self._by_task is None:
            return self._own
        task = _running_task()
        if task is not None:
            held = self._by_task.get(task)
            if held is None or held.token is None:
                held = _holding_core(task, self._key)
            if held is not None:
                return held  # the task's own hold (see `_core`)
            task = _guarded_task(task)
        mine = self._by_task.get(task) if task is not None else self._own
        if mine is not None and (mine.token is not None or mine.lost):
            return mine
        if task is not None:
            held = _held_by_task(task, self._key, mine)
            if held is not None and held.token is not None:
                return held
        cores = [self._own, *self._by_task.values()]
        for core in cores:
            if core.token is not None:
                return core
        for core in cores:
            if core.lost:
                return core
        return self._own

    def remaining(self) -> float | None:
        """Seconds left on the lease; None when not held (see `_shown`)."""
        value: float | None = self._shown().remaining()
        return value

    @property
    def token(self) -> str | None:
        """The owner identifier of the current hold, None when not held (see `_shown`)."""
        value: str | None = self._shown().token
        return value

    @property
    def lost(self) -> bool:
        """True once this hold was found lost (see `_shown`)."""
        return bool(self._shown().lost)

    @property
    def reentrant(self) -> bool:
        """Whether the owning task may acquire again while it holds."""
        return bool(self._own.reentrant)

    async def locked(self) -> bool:
        """True when anybody holds the lock."""
        return bool(await self._own._locked_async())

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (strictly increasing), None when not held."""
        value: int | None = self._shown().fence
        return value

    def __repr__(self) -> str:
        return f"aio.{self._shown()!r}"


class MultiLock(_Hold):
    """`redmutex.MultiLock` for asyncio: `async with multi: ...` holds every name, or none.

    Same arguments and defaults as `redmutex.MultiLock` (`ttl=10.0`; `timeout=None` waits
    forever).
    """

    def __init__(
        self,
        client: ClientLike,
        names: Sequence[str],
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[MultiLock], None] | None = None,
    ) -> None:
        self._auto_renew = bool(auto_renew)
        self._core = _core.MultiLock(
            client,
            names,
            ttl=ttl,
            timeout=timeout,
            auto_renew=auto_renew,
            on_lost=_relay_on_lost(on_lost, self),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The names, each once, in the order given."""
        names: tuple[str, ...] = self._core.names
        return names

    @property
    def fences(self) -> dict[str, int] | None:
        """The fence of each name of the current hold, None when not held."""
        fences: dict[str, int] | None = self._core.fences
        return fences


class Semaphore(_Hold):
    """`redmutex.Semaphore` for asyncio: `async with sem: ...`.

    Same arguments and defaults as `redmutex.Semaphore` (`ttl=10.0`; `timeout=None` waits
    forever; fair, except on a Redlock client, which refuses `fair=True`).
    """

    def __init__(
        self,
        client: ClientLike,
        name: str,
        limit: int,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        fair: bool | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[Semaphore], None] | None = None,
    ) -> None:
        self._auto_renew = bool(auto_renew)
        self._core = _core.Semaphore(
            client,
            name,
            limit,
            ttl=ttl,
            timeout=timeout,
            fair=fair,
            auto_renew=auto_renew,
            on_lost=_relay_on_lost(on_lost, self),
        )

    async def holders(self) -> int:
        """The number of live holders."""
        return int(await self._core._holders_async())

    @property
    def limit(self) -> int:
        """The most holders at once."""
        return int(self._core.limit)


# The read/write locks tell callers apart to refuse a read->write upgrade that would deadlock;
# under asyncio the caller is the task. Task ids come from a counter (never reused, unlike id()).
_task_ids: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_next_task_id = itertools.count(1 << 62)

#: Before Python 3.12 `asyncio.wait_for` runs its awaitable in a task of its own.
_WAIT_FOR_MAKES_A_TASK = sys.version_info < (3, 12)

# The longest an extend waits for renewal to put its lease back (see `extend`): a round trip
# unless the server is slow, when the renewal's own timeouts end it sooner or later.
_EXTEND_SETTLE_LIMIT = 5.0


def _wait_for_caller(task: asyncio.Task[Any]) -> asyncio.Task[Any] | None:
    """The task awaiting `asyncio.wait_for` when `task` is the one that `wait_for` (before
    Python 3.12) made for its awaitable, else None. `wait_for` adds to that task a done-callback
    `partial(_release_waiter, waiter)`, and its caller awaits `waiter` (so its wake-up method is
    among the waiter's callbacks). Anything else, or an asyncio that differs, answers None."""
    release_waiter = getattr(asyncio.tasks, "_release_waiter", None)
    for callback, *_ in getattr(task, "_callbacks", None) or ():
        if not (isinstance(callback, functools.partial) and callback.func is release_waiter):
            continue
        waiter = callback.args[0] if callback.args else None
        for wakeup, *_ in getattr(waiter, "_callbacks", None) or ():
            caller = getattr(wakeup, "__self__", None)
            if isinstance(caller, asyncio.Task) and caller is not task:
                return caller
    return None


def _guarded_task(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """The task the deadlock guard files `task`'s locks under: the caller of the `wait_for`
    (nested ones too) that runs `task`, so that a read lock taken through `wait_for` counts as
    the caller's, as it does from Python 3.12 on (its next write acquire raises instead of
    waiting for itself); else `task`."""
    if not _WAIT_FOR_MAKES_A_TASK:
        return task
    for _ in range(64):  # a bound, in case of a loop no asyncio makes
        caller = _wait_for_caller(task)
        if caller is None:
            break
        task = caller
    return task


def _current_task_id() -> int:
    task = asyncio.current_task()
    if task is None:
        return 0
    task = _guarded_task(task)
    found = _task_ids.get(task)
    if found is None:
        found = _task_ids[task] = next(_next_task_id)
    return found


class RWLockSide(_Hold):
    """The read or the write lock of an `aio.RWLock`."""

    def __init__(self, core_side: Any) -> None:
        self._core = core_side
        self._auto_renew = bool(core_side.rwlock.auto_renew)

    def _context(self) -> tuple[Any, ...]:
        return (_current_task_id(),)

    async def locked(self) -> bool:
        """True when somebody holds the RWLock: a writer, or at least one live reader."""
        return bool(await self._core.rwlock._locked_async())

    @property
    def mode(self) -> Literal["read", "write"]:
        """ "read" or "write"."""
        mode: Literal["read", "write"] = self._core.mode
        return mode


class RWLock:
    """`redmutex.RWLock` for asyncio: `async with rw.read(): ...`, `async with rw.write(): ...`.

    Writer-preferring like `redmutex.RWLock`: no new reader gets in while a writer holds or
    waits, so writers that follow each other without a gap keep readers out (what to do about
    it: see `redmutex.RWLock`).

    The deadlock guard tells tasks apart: a read->write upgrade within one task raises
    LockError, also when the read lock was taken through `asyncio.wait_for` (whose task of its
    own, before Python 3.12, counts as the task that awaits it). A read lock taken in a task of
    its own (`create_task`, `gather`, `shield`) is another task's, as a read lock taken in
    another thread is: a write acquire then waits for it like any other writer (give it a
    timeout)."""

    def __init__(
        self,
        client: ClientLike,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[RWLockSide], None] | None = None,
    ) -> None:
        self._on_lost = on_lost
        # The core reports the core side; map it back to the asyncio side that holds it.
        self._sides: weakref.WeakValueDictionary[int, RWLockSide] = weakref.WeakValueDictionary()
        relay = None
        if on_lost is not None:
            if not callable(on_lost):
                raise TypeError("on_lost: expected a callable")

            def relay(core_side: Any) -> None:
                side = self._sides.get(id(core_side))
                if side is not None:
                    on_lost(side)

        self._core = _core.RWLock(
            client, name, ttl=ttl, timeout=timeout, auto_renew=auto_renew, on_lost=relay
        )

    def _side(self, core_side: Any) -> RWLockSide:
        side = RWLockSide(core_side)
        self._sides[id(core_side)] = side
        return side

    def read(self) -> RWLockSide:
        """A new read lock of this RWLock (shared with other readers; it waits while a writer
        holds or waits for the write lock)."""
        return self._side(self._core.read())

    def write(self) -> RWLockSide:
        """A new write lock of this RWLock (exclusive)."""
        return self._side(self._core.write())

    async def locked(self) -> bool:
        """True when somebody holds the RWLock: a writer, or at least one live reader."""
        return bool(await self._core._locked_async())

    async def readers(self) -> int:
        """The number of live readers."""
        return int(await self._core._readers_async())

    @property
    def name(self) -> str:
        """The RWLock's name."""
        return str(self._core.name)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        _refuse_copy(self)


def locked(
    client: ClientLike,
    name: str,
    *,
    ttl: float = 10.0,
    timeout: float | None = None,
    auto_renew: bool = False,
    fair: bool = False,
) -> AioLockedDecorator:
    """Decorator for `async def`: run it holding the lock `name` (`{param}` from the call).

    An async generator function holds the lock from its first ``__anext__()`` until it
    finishes, raises or is closed (so close one you stop iterating early, e.g. with
    ``contextlib.aclosing``). A plain function is refused with ``TypeError``: use
    ``redmutex.locked``; so is an ``@asynccontextmanager`` function: put ``@aio.locked`` under
    ``@asynccontextmanager``."""
    decorate = lock_decorator(
        client,
        name,
        Lock,
        wrap_async,
        ttl=ttl,
        timeout=timeout,
        auto_renew=auto_renew,
        fair=fair,
    )
    return cast(AioLockedDecorator, decorate)
