"""gevent, for the core (`src/python/greenlets.rs`). A blocking wait on a thread that runs a
gevent hub sleeps through gevent (`Wakeups`), so the other greenlets of its thread run
meanwhile. Once gevent has monkey-patched `threading`, its greenlets are also what `threading`
calls threads, and the core tells callers apart by greenlet (`current`). Nothing here is called
unless gevent is loaded."""

from __future__ import annotations

import importlib
import itertools
import sys
import weakref
from typing import Any

from . import _core

_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# Above the core's thread numbers, below asyncio task ids (`aio._next_task_id`, 1 << 62).
_next_id = itertools.count(1 << 61)


def patched() -> bool:
    """Whether gevent has monkey-patched `threading` in this process."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def current() -> int:
    """The calling greenlet as an owner: a number never reused in this process (the greenlet's
    `id()` can be, once it ended)."""
    me = importlib.import_module("greenlet").getcurrent()
    found = _ids.get(me)
    if found is None:
        found = _ids[me] = next(_next_id)
    return found


def has_hub() -> bool:
    """Whether the calling thread runs a gevent hub (a thread of gevent's threadpool has none:
    its waits block, as without gevent)."""
    # (gevent ships no type stubs: imported by name.)
    hub_local = importlib.import_module("gevent._hub_local")
    return hub_local.get_hub_if_exists() is not None


class Wakeups:
    """One OS thread's cooperative waits (the core's `greenlets::Wakeup`): their wakers write to
    one socket (`fd`), which the thread's hub watches; each sleeping wait waits on an Event of
    its own, set when the core lists it as woken (`_core._woken_waits`)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._sleeping: dict[int, Any] = {}  # wait -> its gevent Event while it sleeps
        self._active: set[int] = set()
        self._woken: set[int] = set()  # woken while not asleep: its next sleep returns at once
        self._hub: Any = None
        self._watcher: Any = None

    def begin(self, wait: int) -> None:
        self._active.add(wait)

    def end(self, wait: int) -> None:
        self._active.discard(wait)
        self._woken.discard(wait)

    def sleep(self, wait: int, timeout: float) -> None:
        """Sleeps this greenlet until `wait` is woken or `timeout` seconds passed."""
        if wait in self._woken:
            self._woken.discard(wait)
            return
        self._watch()
        event = self._sleeping[wait] = importlib.import_module("gevent.event").Event()
        try:
            event.wait(timeout)
        finally:
            del self._sleeping[wait]

    def _watch(self) -> None:
        """Watches the socket on this thread's hub (anew if the hub was replaced)."""
        hub = importlib.import_module("gevent").get_hub()
        if hub is self._hub:
            return
        if self._watcher is not None:
            self._watcher.close()
        watcher = hub.loop.io(self._fd, 1)
        watcher.ref = False  # it must not keep `gevent.wait()` or the hub's loop alive
        watcher.start(self._readable)
        self._hub, self._watcher = hub, watcher

    def _readable(self) -> None:
        for wait in _core._woken_waits():
            event = self._sleeping.get(wait)
            if event is not None:
                event.set()
            elif wait in self._active:
                self._woken.add(wait)
