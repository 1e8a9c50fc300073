"""A small fault-injecting TCP proxy for the fault tests, on loopback only.

`FaultProxy(upstream_port).start()` listens on a free 127.0.0.1 port and forwards every
connection to the upstream server (a test redis-server). While it runs, the test can

- add latency per direction (`set_latency`),
- black-hole traffic in either direction (`blackhole`): connections are still accepted, bytes are
  no longer forwarded; they are either discarded (a partition that outlasts TCP: `heal()` then
  cuts every connection that lost bytes, since TCP never delivers a stream with a gap in it) or
  held and delivered in order when `heal()` is called (a partition that TCP retransmission
  outlives),
- cut every open connection at once (`cut_all`: both sides reset),
- drop exactly one reply (`drop_reply_to`): the first client request containing a marker is
  forwarded, the server's next reply on that connection is discarded and the connection is cut,
  so the client never learns the outcome of a command Redis executed.

The event loop runs on one daemon thread owned by the proxy; every control method runs its change
on that loop and returns once it is in effect. `stop()` closes every socket and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from redmutex._server import RedisServer

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")

C2S = "c2s"  # client -> server: requests
S2C = "s2c"  # server -> client: replies and pub/sub messages
DIRECTIONS = (C2S, S2C)
_CHUNK = 65536


@dataclass
class ProxyStats:
    accepted: int = 0
    cut: int = 0
    dropped_replies: int = 0
    discarded_bytes: int = 0
    forwarded_bytes: dict[str, int] = field(default_factory=lambda: {C2S: 0, S2C: 0})


class _Conn:
    """One proxied connection: the client's socket, the upstream socket and four tasks."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.client_reader, self.client_writer = client
        self.upstream_reader, self.upstream_writer = upstream
        self.tasks: list[asyncio.Task[None]] = []
        self.drop_next_reply = False
        self.closed = False
        # Bytes of this connection were discarded by a black hole: it must not carry any more
        # (what follows would be read as the answer to what was lost), so `heal()` cuts it.
        self.lost_bytes = False
        self.tail = b""  # the end of the last request chunk, for a marker split across chunks

    def abort(self) -> None:
        """Cuts both sides at once (no flushing) and stops the tasks."""
        self._end(graceful=False)

    def close(self) -> None:
        """Closes both sides after flushing what was already written to them."""
        self._end(graceful=True)

    def _end(self, graceful: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_writer, self.upstream_writer):
            transport = writer.transport
            if transport.is_closing():
                continue
            if graceful:
                transport.close()
            else:
                transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.stats = ProxyStats()
        self.reply_dropped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._latency = {C2S: 0.0, S2C: 0.0}
        self._blackholed = {C2S: False, S2C: False}
        self._hold = False
        self._healed: asyncio.Event | None = None
        self._marker: bytes | None = None
        self._blackhole_on_drop = False

    # ------------------------------------------------------------------------ life cycle

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="fault-proxy", daemon=True
        )
        self._thread.start()
        self.port = ready.result(timeout=10)
        return self

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._healed = asyncio.Event()
            self._healed.set()
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            ready.set_result(int(self._server.sockets[0].getsockname()[1]))
            loop.run_forever()
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            if not ready.done():
                ready.set_exception(exc)
        finally:
            # Cancelled tasks may leave others behind (a delivery of a connection being cut):
            # the loop closes only once none is left, so none is destroyed pending later.
            for _ in range(10):
                pending = asyncio.all_tasks(loop)
                if not pending:
                    break
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.abort()
            self._conns.clear()

        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the proxy thread did not stop"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------- controls

    def _call(self, fn: Callable[[], T]) -> T:
        """Runs `fn` on the proxy's loop and returns its result once it ran."""
        assert self._loop is not None, "the proxy is not running"
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(timeout=10)

    def set_latency(self, seconds: float, direction: str = "both") -> None:
        """Every chunk read from now on is delivered `seconds` later (per direction)."""

        def apply() -> None:
            for d in _directions(direction):
                self._latency[d] = seconds

        self._call(apply)

    def blackhole(self, direction: str = "both", *, hold: bool = False) -> None:
        """Stops forwarding in `direction`; new connections are accepted but black-holed too.
        hold=False discards the bytes (`heal()` then cuts the connections that lost some),
        hold=True keeps them for `heal()` to deliver."""

        self._call(lambda: self._start_blackhole(_directions(direction), hold=hold))

    def _start_blackhole(self, directions: tuple[str, ...], *, hold: bool) -> None:
        assert self._healed is not None
        self._hold = hold
        for d in directions:
            self._blackholed[d] = True
        self._healed.clear()

    def heal(self) -> None:
        """Forwarding resumes in both directions (held bytes first, in order); connections that
        lost bytes to the black hole are cut (both sides reset), as TCP would have ended them."""

        def apply() -> None:
            assert self._healed is not None
            for conn in [c for c in self._conns if c.lost_bytes]:
                self._forget(conn)
                self.stats.cut += 1
            for d in DIRECTIONS:
                self._blackholed[d] = False
            self._healed.set()

        self._call(apply)

    def cut_all(self) -> int:
        """Resets every open connection (client and upstream side); returns how many."""

        def apply() -> int:
            conns = list(self._conns)
            for conn in conns:
                conn.abort()
            self._conns.clear()
            self.stats.cut += len(conns)
            return len(conns)

        return self._call(apply)

    def drop_reply_to(self, marker: bytes, *, then_blackhole: bool = False) -> None:
        """One shot: the next request containing `marker` is forwarded; the server's next reply
        on that connection is discarded and the connection is cut (`reply_dropped` is set).
        then_blackhole: at that moment every connection is black-holed too (bytes discarded),
        so the client's retry fails as well, until `heal()`."""

        def apply() -> None:
            self.reply_dropped.clear()
            self._marker = marker
            self._blackhole_on_drop = then_blackhole

        self._call(apply)

    def disarm(self) -> None:
        def apply() -> None:
            self._marker = None
            self._blackhole_on_drop = False

        self._call(apply)

    def connections(self) -> int:
        return self._call(lambda: len(self._conns))

    # ------------------------------------------------------------------------ forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5)
        except (OSError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        conn = _Conn((reader, writer), upstream)
        self._conns.add(conn)
        c2s: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        s2c: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        conn.tasks = [
            asyncio.ensure_future(self._read(conn, C2S, conn.client_reader, c2s)),
            asyncio.ensure_future(self._read(conn, S2C, conn.upstream_reader, s2c)),
            asyncio.ensure_future(self._deliver(conn, C2S, c2s, conn.upstream_writer)),
            asyncio.ensure_future(self._deliver(conn, S2C, s2c, conn.client_writer)),
        ]

    async def _read(
        self,
        conn: _Conn,
        direction: str,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                marker = self._marker
                if direction == C2S and marker is not None:
                    if marker in conn.tail + data:
                        self._marker = None
                        conn.drop_next_reply = True
                    conn.tail = data[-len(marker) :]
                if direction == S2C and conn.drop_next_reply:
                    # The reply to the marked request: Redis executed it, the client never
                    # hears of it. Cut the connection, as a network failure would.
                    conn.drop_next_reply = False
                    if self._blackhole_on_drop:
                        self._blackhole_on_drop = False
                        self._start_blackhole(DIRECTIONS, hold=False)
                    self.stats.dropped_replies += 1
                    self.stats.discarded_bytes += len(data)
                    self._forget(conn)
                    self.reply_dropped.set()
                    return
                queue.put_nowait((loop.time() + self._latency[direction], data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        # End of stream or a failed socket: the other side learns of it after what is queued.
        queue.put_nowait(None)

    async def _deliver(
        self,
        conn: _Conn,
        direction: str,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        assert self._healed is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                deliver_at, data = item
                delay = deliver_at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                discard = False
                while self._blackholed[direction]:
                    if not self._hold:
                        discard = True
                        break
                    await self._healed.wait()
                if discard:
                    conn.lost_bytes = True
                    self.stats.discarded_bytes += len(data)
                    continue
                writer.write(data)
                await writer.drain()
                self.stats.forwarded_bytes[direction] += len(data)
        except OSError:
            self._forget(conn)
            return
        # The source side ended: everything it sent is delivered, now end the other side too.
        self._conns.discard(conn)
        conn.close()

    def _forget(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        conn.abort()


@contextlib.contextmanager
def proxied_server() -> Iterator[tuple[RedisServer, FaultProxy]]:
    """A private redis-server and a FaultProxy in front of it, both ended on leaving."""
    server = RedisServer().start()
    try:
        with FaultProxy(server.port) as proxy:
            yield server, proxy
    finally:
        server.close()


def _directions(direction: str) -> tuple[str, ...]:
    if direction == "both":
        return DIRECTIONS
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected 'c2s', 's2c' or 'both', got {direction!r}")
    return (direction,)
