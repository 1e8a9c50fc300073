"""One `_core.LoopWaker` per event loop: the Rust runtime queues finished operations there and
wakes the loop through a socket, so only the loop's own thread ever touches their futures.

The loop path (`_core.LoopConn`): each loop's own connection to a client's server, opened here
on first use, carries the one-round-trip steps with no runtime thread in the round trip."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any

from ._core import LoopConn, LoopWaker

_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker] = (
    weakref.WeakKeyDictionary()
)


def waker_for(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The waker of `loop`, registered as a reader the first time (called on the loop's thread)."""
    waker = _wakers.get(loop)
    if waker is None:
        _hook_close(loop)
        waker = LoopWaker()
        loop.add_reader(waker.fileno(), waker.drain)
        _wakers[loop] = waker
    return waker


class LoopProtocol(LoopConn, asyncio.BufferedProtocol):
    """The loop path's protocol: a `BufferedProtocol` (so that the transport reads into
    `get_buffer()` instead of making a new bytes object per read), all of it in `LoopConn`."""

    __slots__ = ("__weakref__",)


_log = logging.getLogger("redmutex")

#: The loop connections opened for each client (by the address of its core, which is the key of
#: the loop's `_redmutex_conns`), each with its loop, so that closing the client closes them.
#: Held weakly: the loop's dict holds a connection while it is in use.
_client_conns: dict[
    int, list[tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[LoopProtocol]]]
] = {}


def track_conn(key: int, loop: asyncio.AbstractEventLoop, conn: LoopProtocol) -> None:
    """Files `conn`, just opened on `loop` for the client `key`, for `retire_conns`; forgets the
    connections gone meanwhile (those of clients dropped without `close()` too)."""
    for filed in list(_client_conns):
        kept = [(lr, cr) for lr, cr in _client_conns[filed] if cr() is not None]
        if kept:
            _client_conns[filed] = kept
        else:
            del _client_conns[filed]
    _client_conns.setdefault(key, []).append((weakref.ref(loop), weakref.ref(conn)))


def retire_conns(key: int) -> None:
    """The client `key` was closed: each loop's connection of it closes once its calls are
    answered (`LoopConn._retire`, on the loop's own thread); a later use opens a new one."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for loop_ref, conn_ref in _client_conns.pop(key, ()):
        loop, conn = loop_ref(), conn_ref()
        if loop is None or conn is None or loop.is_closed():
            continue
        if loop is running:
            conn._retire()
        else:
            try:
                loop.call_soon_threadsafe(conn._retire)
            except RuntimeError:  # closed meanwhile: its connections were closed with it
                pass


def _close_conns(loop: asyncio.AbstractEventLoop) -> None:
    """Ends `loop`'s connections before the loop closes: an opening one is cancelled (no "Task
    was destroyed but it is pending"), an open one closed (its socket is closed by a callback of
    the loop: hence one last short run of the loop)."""
    opening = [task for task in getattr(loop, "_redmutex_opening", ()) if not task.done()]
    conns = [c for c in getattr(loop, "_redmutex_conns", {}).values() if isinstance(c, LoopConn)]
    if not conns and not opening:
        return

    async def end() -> None:
        for task in opening:
            task.cancel()
        await asyncio.gather(*opening, return_exceptions=True)
        for conn in conns:
            conn._close()
        await asyncio.sleep(0)  # transport.close() closes the socket on the next iteration

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop.run_until_complete(end())
        return
    # This thread runs another loop (and one thread runs one loop at a time): `loop` is run
    # for its last steps by a thread of its own.
    thread = threading.Thread(target=loop.run_until_complete, args=(end(),), daemon=True)
    thread.start()
    thread.join()


#: The auto-renewed holds (object -> token) and the cache's fill claims (claim -> None) taken on
#: each loop (see `renewed_on_loop`), by id(loop), with a weak reference to the loop. Kept here,
#: not on the loop: a loop nobody closes is closed by the garbage collector, which first clears
#: every weak reference that only garbage refers to, so a mapping of the loop's own would be
#: empty by then.
_renewed: dict[
    int,
    tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.WeakKeyDictionary[Any, str | None]],
] = {}


def renewed_on_loop(loop: asyncio.AbstractEventLoop, core: Any, token: str) -> None:
    """Ties the auto-renewed hold `token` of `core` (a `_core` lock-like object) to `loop`, on
    which it was taken: closing the loop ends its renewal. Its owner was a task of that loop,
    which is gone, so nobody is left to release it: its lease runs out within the ttl instead of
    being renewed from the runtime for as long as the object lives."""
    _tie_to_loop(loop, core, token)


def claimed_on_loop(loop: asyncio.AbstractEventLoop, claim: Any) -> None:
    """Ties a cache entry's fill claim (`_core.FillClaim`, renewed while held) to `loop`, on
    which its fill runs: closing the loop gives it back unless stored or given back already
    (the fill's task never runs again; one waiting caller takes the fill over)."""
    _tie_to_loop(loop, claim, None)


def _tie_to_loop(loop: asyncio.AbstractEventLoop, held: Any, token: str | None) -> None:
    _hook_close(loop)
    entry = _renewed.get(id(loop))
    if entry is None or entry[0]() is not loop:
        if entry is not None:
            # A loop of the same id that ended without its close hook: its holds' owners are
            # gone too.
            _stop_renewals(entry[1])
        entry = _renewed[id(loop)] = (weakref.ref(loop), weakref.WeakKeyDictionary())
    entry[1][held] = token


def _end_renewals(loop: asyncio.AbstractEventLoop) -> None:
    """Ends the renewal of the holds taken on `loop` that are still held (see `renewed_on_loop`);
    a hold released meanwhile, or replaced by another one, is left alone (its token differs).
    The entry's weak reference to the loop is dead when the garbage collector closes the loop."""
    entry = _renewed.get(id(loop))
    if entry is None:
        return
    found = entry[0]()
    if (found is not None and found is not loop) or _renewed.pop(id(loop), None) is not entry:
        return
    _stop_renewals(entry[1])


def _stop_renewals(holds: weakref.WeakKeyDictionary[Any, str | None]) -> None:
    for held, token in list(holds.items()):
        try:
            if token is not None:
                held._stop_renewal(token)
            elif held.held:
                held.abandon()  # a fill claim: one round trip, bounded by command_timeout
        except Exception:  # noqa: BLE001 - the other holds and the loop close all the same
            _log.warning("could not end the renewal of %r", held, exc_info=True)
    holds.clear()


def _hook_close(loop: asyncio.AbstractEventLoop) -> None:
    """Makes `loop.close()` end the loop's connections, its acquires still under way, the
    renewal of the holds and the fill claims taken on it first (once per loop). Closing is the
    one step every way of ending a loop takes: `asyncio.run` and other runners, a bare
    `loop.close()`, and the garbage collector (`BaseEventLoop.__del__` closes an unclosed
    loop); a loop closed without `shutdown_asyncgens` used to keep its connection open."""
    if getattr(loop, "_redmutex_close", None) is not None:
        return
    close = loop.close

    def close_with_conns() -> None:
        if not loop.is_running() and not loop.is_closed():
            try:
                _close_conns(loop)
            except Exception:  # noqa: BLE001 - the loop closes all the same
                _log.warning("could not close the event loop's connections", exc_info=True)
            waker = _wakers.get(loop)
            if waker is not None:
                waker.close()  # its acquires still under way belong to nobody now
            _end_renewals(loop)
        close()

    # The wrapper lives on the loop (and refers to it): no reference from outside keeps the
    # loop alive. `Any`: the loop's own attributes, which its type does not declare.
    attrs: Any = loop
    try:
        attrs._redmutex_close = close
        attrs.close = close_with_conns
    except AttributeError:  # a loop class without instance attributes: closing it does less
        return


def open_connection(
    loop: asyncio.AbstractEventLoop,
    protocol: Any,
    host: str | None,
    port: int | None,
    path: str | None,
    timeout: float,
) -> None:
    """Opens the loop's own connection for `protocol` (a `_core.LoopConn`) in the background;
    until it is ready, the runtime serves the loop's calls."""

    async def run() -> None:
        try:
            if path is not None:
                await asyncio.wait_for(loop.create_unix_connection(lambda: protocol, path), timeout)
            elif host is not None and port is not None:
                opening = loop.create_connection(lambda: protocol, host, port)
                await asyncio.wait_for(opening, timeout)
            else:
                protocol._connect_failed()
        except (OSError, asyncio.TimeoutError, ValueError):
            protocol._connect_failed()

    _hook_close(loop)
    attrs: Any = loop
    # The loop holds the opening task (asyncio keeps only weak references to tasks): a global
    # set would keep a loop closed meanwhile alive for good.
    opening: set[asyncio.Task[None]] | None = getattr(loop, "_redmutex_opening", None)
    if opening is None:
        opening = attrs._redmutex_opening = set()
    task = loop.create_task(run())
    opening.add(task)
    task.add_done_callback(opening.discard)
