"""Optional metrics hooks: route lock wait and hold times to Prometheus, statsd or anything else,
without redmutex depending on any of them.

    import redmutex.metrics

    def on_acquire(event: redmutex.metrics.AcquireEvent) -> None:
        LOCK_WAIT.labels(event.kind).observe(event.waited)     # a prometheus_client Histogram

    def on_release(event: redmutex.metrics.ReleaseEvent) -> None:
        LOCK_HELD.labels(event.kind).observe(event.held)
        if event.lost:
            LOCK_LOST.labels(event.kind).inc()

    redmutex.metrics.set_hooks(on_acquire=on_acquire, on_release=on_release)

Where events come from: the Python layer, where it already wraps the Rust core — the classic
recipe (`acquire_lock`, `release_lock`, `redis_lock`) and `@locked` — and `measured(lock)`, which
wraps any lock object you choose (`Lock`, `Semaphore`, `RWLock.read()`/`write()` and their
`redmutex.aio` versions, with `with` or `async with`). A plain `Lock.acquire()` or `with lock:`
runs in Rust and reports nothing, so measuring never slows the hot path of code that does not ask
for it; with no hooks set, the wrapped paths only test one module global.

Hooks run synchronously on the thread (or event loop) that acquired or released: keep them
fast. A hook that raises is logged on the `redmutex` logger and otherwise ignored.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from .errors import LockLostError

__all__ = ["AcquireEvent", "ReleaseEvent", "clear_hooks", "measured", "set_hooks"]

_log = logging.getLogger("redmutex")


@dataclass(frozen=True, slots=True)
class AcquireEvent:
    """One attempt to acquire, reported when it ended."""

    name: str  # the lock's name (without the key prefix)
    kind: str  # "lock", "semaphore", "rwlock.read" or "rwlock.write"
    waited: float  # seconds from the call until it was acquired or given up
    acquired: bool  # False: timed out or failed (the exception still propagates)


@dataclass(frozen=True, slots=True)
class ReleaseEvent:
    """One hold that ended (released, or found lost on leaving)."""

    name: str
    kind: str
    held: float  # seconds from acquired to released
    lost: bool  # the lease had ended before the release (LockLostError, release_lock -> False)


AcquireHook = Callable[[AcquireEvent], object]
ReleaseHook = Callable[[ReleaseEvent], object]


@dataclass(frozen=True, slots=True)
class _Hooks:
    on_acquire: AcquireHook | None
    on_release: ReleaseHook | None


# None while no hook is set: the only thing an unmeasured call looks at.
_active: _Hooks | None = None

# acquire_lock/release_lock are separate calls: the time of each measured acquisition, by
# (lockname, identifier), until its release. Bounded: holds never released just age out.
_recipe_starts: dict[tuple[str, str], float] = {}
_RECIPE_STARTS_KEPT = 10_000
_recipe_lock = threading.Lock()


def set_hooks(
    *, on_acquire: AcquireHook | None = None, on_release: ReleaseHook | None = None
) -> None:
    """Installs the hooks (replacing any set before); `None` for both turns metrics off."""
    global _active
    for arg, hook in (("on_acquire", on_acquire), ("on_release", on_release)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{arg}: expected a callable or None, not {type(hook).__name__}")
    _active = None if on_acquire is None and on_release is None else _Hooks(on_acquire, on_release)
    if _active is None:
        with _recipe_lock:
            _recipe_starts.clear()


def clear_hooks() -> None:
    """Turns metrics off."""
    set_hooks()


def _call(hook: Callable[[Any], object], event: AcquireEvent | ReleaseEvent) -> None:
    try:
        hook(event)
    except Exception:  # noqa: BLE001 - a broken hook must not break locking
        _log.warning("metrics hook %r raised", hook, exc_info=True)


def report_acquire(name: str, kind: str, waited: float, acquired: bool) -> None:
    hooks = _active
    if hooks is not None and hooks.on_acquire is not None:
        _call(hooks.on_acquire, AcquireEvent(name, kind, waited, acquired))


def report_release(name: str, kind: str, held: float, lost: bool) -> None:
    hooks = _active
    if hooks is not None and hooks.on_release is not None:
        _call(hooks.on_release, ReleaseEvent(name, kind, held, lost))


def recipe_acquired(lockname: str, identifier: str, started: float, acquired: bool) -> None:
    """`acquire_lock` ended (called only while hooks are set)."""
    now = time.perf_counter()
    if acquired:
        with _recipe_lock:
            if len(_recipe_starts) >= _RECIPE_STARTS_KEPT:
                del _recipe_starts[next(iter(_recipe_starts))]
            _recipe_starts[(lockname, identifier)] = now
    report_acquire(lockname, "lock", now - started, acquired)


def recipe_released(lockname: str, identifier: str, released: bool) -> None:
    """`release_lock` ended (called only while hooks are set); a hold whose acquisition was not
    measured (hooks set later, another process) is not reported."""
    with _recipe_lock:
        started = _recipe_starts.pop((lockname, identifier), None)
    if started is not None:
        report_release(lockname, "lock", time.perf_counter() - started, not released)


def kind_of(hold: Any) -> str:
    """The kind of a lock object (also asyncio's): "lock", "semaphore", "rwlock.read" or
    "rwlock.write"."""
    core = getattr(hold, "_core", hold)
    mode = getattr(core, "mode", None)
    if mode in ("read", "write"):
        return f"rwlock.{mode}"
    return "semaphore" if hasattr(core, "holders") else "lock"


H = TypeVar("H")


class measured(Generic[H]):  # a class used like a function: `with measured(lock) as lock:`
    """`with measured(lock) as lock:` (or `async with`) behaves exactly like `with lock:`, and
    reports the wait and the hold to the hooks. Works with every lock object of redmutex and
    redmutex.aio; costs one global lookup when no hooks are set."""

    __slots__ = ("_acquired_at", "_hold", "_kind")

    def __init__(self, hold: H) -> None:
        self._hold = hold
        self._kind: str | None = None
        # When each hold still on was taken (None: hooks were off then), innermost last: a
        # re-entrant lock's nested `with` blocks are holds of their own, each reported.
        self._acquired_at: list[float | None] = []

    def _started(self) -> float | None:
        if _active is None:
            return None
        if self._kind is None:
            self._kind = kind_of(self._hold)
        return time.perf_counter()

    def _entered(self, started: float | None, acquired: bool) -> None:
        now = None if started is None else time.perf_counter()
        if acquired:
            self._acquired_at.append(now)
        if started is None or now is None:
            return
        name = str(getattr(self._hold, "name", "?"))
        report_acquire(name, self._kind or "lock", now - started, acquired)

    def _left(self, lost: bool) -> None:
        acquired_at = self._acquired_at.pop() if self._acquired_at else None
        if acquired_at is None:
            return
        held = time.perf_counter() - acquired_at
        lost = lost or bool(getattr(self._hold, "lost", False))
        report_release(str(getattr(self._hold, "name", "?")), self._kind or "lock", held, lost)

    def __enter__(self) -> H:
        hold: Any = self._hold
        started = self._started()
        try:
            hold.__enter__()
        except BaseException:
            self._entered(started, False)
            raise
        try:
            self._entered(started, True)
        except BaseException as exc:
            # The hook was interrupted (Ctrl-C, SystemExit): the `with` block never starts, so
            # its exit never runs; the hold is given back here, as `with lock:` gives it back.
            self._acquired_at.pop()
            with contextlib.suppress(Exception):
                hold.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self._hold

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold: Any = self._hold
        lost = False
        try:
            hold.__exit__(exc_type, exc, tb)
        except LockLostError:
            lost = True
            raise
        finally:
            self._left(lost)

    async def __aenter__(self) -> H:
        hold: Any = self._hold
        started = self._started()
        try:
            await hold.__aenter__()
        except BaseException:
            self._entered(started, False)
            raise
        try:
            self._entered(started, True)
        except BaseException as exc:
            self._acquired_at.pop()  # see __enter__
            with contextlib.suppress(Exception):
                await hold.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self._hold

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold: Any = self._hold
        lost = False
        try:
            await hold.__aexit__(exc_type, exc, tb)
        except LockLostError:
            lost = True
            raise
        finally:
            self._left(lost)
