"""gevent, for the core (`src/python/greenlets.rs`). Once gevent has monkey-patched `threading`,
its greenlets are what `threading` calls threads: the core tells callers apart by greenlet
(`current`) and lets a blocking wait sleep through gevent (`wait_readable`), so the other
greenlets of its thread run meanwhile. Nothing here is called without that patching."""

from __future__ import annotations

import importlib
import itertools
import sys
import weakref
from typing import Any

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


def wait_readable(fd: int, timeout: float) -> None:
    """Sleeps this greenlet until `fd` is readable or `timeout` seconds passed; the thread's
    other greenlets run meanwhile."""
    importlib.import_module("gevent.select").select([fd], [], [], timeout)
