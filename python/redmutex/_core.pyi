"""Type stubs of `redmutex._core`, the Rust extension (src/python/*.rs).

Checked against the built module by `python -m mypy.stubtest redmutex._core` (`make lint`).
Every constructor argument documented with a default also accepts None, meaning that default,
except a lease (`ttl`, `lock_ttl`): None there is a TypeError (a lease is never infinite).
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeAlias, final

from typing_extensions import Self, disjoint_base

from redmutex._types import ClientLike, RedisLike

__all__ = [
    "CacheHit",
    "CacheStore",
    "Client",
    "FillClaim",
    "Lock",
    "LoopConn",
    "LoopWaker",
    "MultiLock",
    "RWLock",
    "RWLockSide",
    "Semaphore",
    "_CompatHold",
    "_CompatLock",
    "__version__",
    "_aio_calls",
    "_caller",
    "_force_release",
    "_hold_count",
    "_interpreter_exiting",
    "_keys",
    "_kinds",
    "_loop_cancelled",
    "_parse_url",
    "_redact_text",
    "_redact_url",
    "_scan_pattern",
    "_script_source",
    "_split_key",
    "_waiting_attempts",
    "_woken_waits",
    "acquire_token",
    "release_token",
]

__version__: str

@final
class LoopWaker:
    """One event loop's end of the asyncio bridge (see redmutex._aio_bridge)."""

    def __new__(cls) -> LoopWaker: ...
    def fileno(self) -> int:
        """The file descriptor the loop watches."""
    def drain(self) -> None:
        """Empties the wake-up pipe."""

    def close(self) -> None:
        """The loop is closing: abandons its acquires still under way."""

    def _acquires_under_way(self) -> int: ...

@disjoint_base
class LoopConn:
    """An event loop's own connection to a client's server (the asyncio loop path): an asyncio
    buffered protocol (as redmutex._aio_bridge.LoopProtocol), made by the core."""

    def __new__(cls, seed: object) -> Self: ...
    def connection_made(self, transport: Any) -> None: ...
    def get_buffer(self, sizehint: int) -> bytearray: ...
    def buffer_updated(self, nbytes: int) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool: ...
    def connection_lost(self, exc: BaseException | None = None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def _connect_failed(self) -> None: ...
    def _close(self) -> None: ...
    def _retire(self) -> None: ...
    def _on_timer(self) -> None: ...

@final
class Client:
    """A connection to Redis for the primitives: one server, a Redlock set or a Cluster.

    `Client(url="redis://127.0.0.1:6379/0", *, prefix="redmutex:", connect_timeout=5.0,
    command_timeout=5.0, fence_ttl=86400.0)`. `url` is a `redis://`, `rediss://` (TLS), `unix://` or
    `redis+unix://` URL (password never shown); a list of URLs is a Redlock set of independent
    masters (quorum N//2+1); `cluster=[seed, ...]` is a Redis Cluster. Constructing does not
    connect: a bad URL raises ValueError now, an unreachable server ConnectionError at first use.
    On a single server (not a Redlock master; Sentinel and Cluster follow failovers instead), a
    connect that is refused (the server is restarting; for a unix socket, its file is missing) or
    answered `LOADING` is tried again with a short growing pause (10 ms up to 160 ms) until
    `connect_timeout` has passed since the first refusal, then raises ConnectionError: a restart
    shorter than that is waited out, a waiting acquire keeps waiting. Wrong credentials, a missing
    permission, a TLS failure or a connect that timed out raise at once.
    None for any argument means its default.
    A blocking call that waits on a server which does not answer runs Python's signal handlers
    every 50 ms, so Ctrl-C (KeyboardInterrupt) lands at once rather than after `command_timeout`
    (except over TLS, where a call's first round trip may wait out `command_timeout`). A Lock,
    Semaphore or RWLock acquire cut short that way may still run on the server: it is given back
    once the server answers it (else its lease ends); the object holds nothing.
    """

    def __new__(
        cls,
        url: str | Sequence[str] | None = None,
        *,
        prefix: str | None = None,
        connect_timeout: float | None = None,
        command_timeout: float | None = None,
        cluster: Sequence[str] | None = None,
        fence_ttl: float | None = None,
    ) -> Self: ...
    @classmethod
    def from_redis(cls, redis_client: RedisLike) -> Client:
        """A Client with the host, port, db, user, password, TLS and socket settings of a
        redis-py client (which is not used itself: the core opens its own connections). Its
        `socket_connect_timeout`/`socket_timeout` become `connect_timeout`/`command_timeout`;
        its `client_name` and `protocol` are not used by the core's connections."""
    def ping(self) -> bool:
        """True when Redis answers; raises `redmutex.ConnectionError` otherwise."""
    def close(self) -> None:
        """Closes the connections (also done on leaving `with Client(...)`)."""
    @property
    def fence_ttl(self) -> float:
        """Seconds a name's fencing counter lives after its last acquisition (default 86400.0;
        at least 0.001, like every `ttl`)."""
    @property
    def prefix(self) -> str:
        """The key prefix of every primitive (default "redmutex:")."""
    @property
    def url(self) -> str:
        """The URL with any password redacted."""
    def __enter__(self) -> Self:
        """`with Client(...) as client:` closes the client on leaving."""
    def __exit__(self, *_exc: object) -> Literal[False]: ...

@final
class Lock:
    """A distributed mutex named `name` on Redis: `with Lock(client, "name", ttl=5): ...`.

    `ttl: float = 10.0`: the lease in seconds (never None: a lease is never infinite; use
    `auto_renew=True` for long holds). `timeout: float | None = None`: the default wait of
    `acquire()` and `with`; None (or `math.inf`) waits forever, 0 tries once.
    `auto_renew=False`: extend the lease every ttl/3 in the background while held.
    `fair=False`: True serves waiters in arrival order (FIFO); with False a free lock goes to
    whoever asks first, and waiters that wait are served roughly in arrival order (a release
    grants the lock to the first one queued). `replicas=0`: k > 0 requires k replicas to
    acknowledge the lock write (Redis WAIT; a WAIT that Redis ends with an `UNBLOCKED` error
    counts as acknowledged by none: the lock is given back and the acquire fails like a timeout).
    `on_lost=None`: called once with the lock, from a background thread, when renewal (or the
    top-up of a lease granted short) finds it lost.
    `reentrant=False`: ownership belongs to this object, and a second acquire raises LockError.
    With True the owner is the calling thread (under gevent's monkey-patching, the greenlet):
    the thread that holds may acquire again (each
    acquire needs its release; the lock is free after the last), through this object or any
    other re-entrant Lock of the same client and name (a re-entry acts on the hold as it was
    taken, and lives with the object that took it: drop that object while it holds, and the
    hold is left to run out, as any dropped object's); another thread waits like any other
    waiter; the hold count lives in Redis with the hold. Waiters are woken, never poll.
    """

    def __new__(
        cls,
        client: ClientLike,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool | None = None,
        fair: bool | None = None,
        replicas: int | None = None,
        on_lost: Callable[[Lock], object] | None = None,
        reentrant: bool | None = None,
    ) -> Self: ...
    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Takes the lock; True when acquired, False when the wait ended first.

        `blocking`: None or True waits, False tries once. `timeout`: None means the
        constructor's timeout (whose default None waits forever), `math.inf` forever, 0 once.
        Raises LockError if this object already holds it, unless re-entrant: then the owning
        thread's acquire succeeds at once (LockLostError if its hold was found lost).
        """
    def release(self) -> None:
        """Releases the hold (re-entrant: one acquire of the calling thread's). LockNotOwnedError
        when this object holds nothing, LockLostError when the lease expired or another owner
        has the lock. A nested release that raised ConnectionError did not count: retrying it
        is that same release."""
    def extend(self, ttl: float | None = None) -> None:
        """The lease now ends `ttl` seconds from now (None: the lock's own ttl). Raises like
        release()."""
    def locked(self) -> bool:
        """True when anybody holds the lock (asks Redis)."""
    def owned(self) -> bool:
        """True when this object holds the lock, checked against Redis."""
    def remaining(self) -> float | None:
        """Seconds left on this object's lease (local clock); None when not held, 0.0 once
        the deadline passed."""
    @property
    def token(self) -> str | None:
        """The owner identifier of the current hold (32 hex chars), None when not held."""
    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold: strictly increasing across acquisitions of
        this name; None when not held."""
    @property
    def reentrant(self) -> bool:
        """Whether the owning thread may acquire again while it holds."""
    @property
    def _depth(self) -> int:
        """How many acquires the calling thread's hold stands for (0: none)."""
    @property
    def lost(self) -> bool:
        """True once this hold was found lost (by renewal, extend or release)."""
    @property
    def name(self) -> str:
        """The lock's name."""
    @property
    def ttl(self) -> float:
        """The lease in seconds."""
    @property
    def client(self) -> Client:
        """The Client this lock talks through."""
    def __enter__(self) -> Self:
        """Acquires with the constructor's timeout; LockTimeoutError when not acquired."""
    def __exit__(self, *exc: object) -> Literal[False]:
        """Releases; LockLostError if the lease was lost while the block ran (when the block
        raised, its exception propagates and the loss is logged). A release that raised
        (ConnectionError) still ends the hold here: it goes on in the background until the lease
        would end."""
    # Awaited by redmutex.aio.Lock; same semantics as the blocking methods.
    def _acquire_async(
        self, blocking: bool | None = None, timeout: float | None = None
    ) -> asyncio.Future[bool]: ...
    def _enter_async(self) -> asyncio.Future[None]: ...
    def _release_async(self) -> asyncio.Future[None]: ...
    def _give_back(self, token: str) -> bool: ...
    def _stop_renewal(self, token: str) -> bool: ...
    def _release_abandoned(self) -> bool: ...
    def _extend_async(self, ttl: float | None = None) -> asyncio.Future[None]: ...
    def _extend_settling(self) -> bool: ...
    def _owned_async(self) -> asyncio.Future[bool]: ...
    def _locked_async(self) -> asyncio.Future[bool]: ...
    def _exit_async(self, body_raised: bool) -> asyncio.Future[bool]: ...

@final
class MultiLock:
    """Several lock names held together, all or none: `with MultiLock(client, ["a", "b"]): ...`.

    The names are `Lock` names (the same keys): a MultiLock and single Locks on the same names
    exclude each other, and a name with waiters in its fair queue counts as busy. A name given
    twice counts once; `names` must be a non-empty sequence of str. `ttl: float = 10.0`: the
    lease of every name. `timeout: float | None = None`: the default wait of `acquire()` and
    `with`. `auto_renew=False`: renew every name every ttl/3 while held. `on_lost=None`: called
    once with the object when renewal finds a lease lost. On one server every attempt takes all
    names in one atomic step; on a Redis Cluster they are taken in one global order (sorted by
    name), and whatever was taken is given back when the rest cannot be had in time, so two
    MultiLocks over overlapping names never deadlock. Waiters are woken, never poll.
    """

    def __new__(
        cls,
        client: ClientLike,
        names: Sequence[str],
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool | None = None,
        on_lost: Callable[[MultiLock], object] | None = None,
    ) -> Self: ...
    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Takes every name, or none; True when acquired, False when the wait ended first
        (nothing is held then). Raises LockError if this object already holds them."""
    def release(self) -> None:
        """Releases every name still held. LockNotOwnedError when this object holds nothing,
        LockLostError when the lease of any name was lost (the others are released)."""
    def extend(self, ttl: float | None = None) -> None:
        """The lease of every name now ends `ttl` seconds from now (None: the own ttl). Raises
        like release()."""
    def owned(self) -> bool:
        """True when this object holds every name, checked against Redis."""
    def remaining(self) -> float | None:
        """Seconds left on this object's lease (local clock); None when not held."""
    @property
    def token(self) -> str | None:
        """The owner identifier of the current hold (the same on every name), None when not
        held."""
    @property
    def fences(self) -> dict[str, int] | None:
        """The fencing token of each name of the current hold; None when not held."""
    @property
    def names(self) -> tuple[str, ...]:
        """The names, each once, in the order given."""
    @property
    def lost(self) -> bool:
        """True once this hold was found lost (by renewal, extend or release)."""
    @property
    def name(self) -> str:
        """The names joined with ", " (for messages)."""
    @property
    def ttl(self) -> float:
        """The lease in seconds."""
    @property
    def client(self) -> Client:
        """The Client this MultiLock talks through."""
    def __enter__(self) -> Self:
        """Acquires with the constructor's timeout; LockTimeoutError when not acquired."""
    def __exit__(self, *exc: object) -> Literal[False]:
        """Releases; LockLostError if a lease was lost while the block ran. A release that
        raised (ConnectionError) still ends the hold here: it goes on in the background until
        the leases would end."""
    # Awaited by redmutex.aio.MultiLock; same semantics as the blocking methods.
    def _acquire_async(
        self, blocking: bool | None = None, timeout: float | None = None
    ) -> asyncio.Future[bool]: ...
    def _enter_async(self) -> asyncio.Future[None]: ...
    def _release_async(self) -> asyncio.Future[None]: ...
    def _give_back(self, token: str) -> bool: ...
    def _stop_renewal(self, token: str) -> bool: ...
    def _release_abandoned(self) -> bool: ...
    def _extend_async(self, ttl: float | None = None) -> asyncio.Future[None]: ...
    def _extend_settling(self) -> bool: ...
    def _owned_async(self) -> asyncio.Future[bool]: ...
    def _exit_async(self, body_raised: bool) -> asyncio.Future[bool]: ...

@final
class Semaphore:
    """At most `limit` holders of `name` at once: `with Semaphore(client, "jobs", 3): ...`.

    `ttl: float = 10.0`: each holder's lease in seconds (a dead holder stops counting when it
    ends). `timeout: float | None = None`: the default wait of `acquire()` and `with`; None
    waits forever, 0 tries once. `fair`: waiters in arrival order (the default; on a Redlock
    client unfair by default, and `fair=True` raises NotImplementedError). `auto_renew=False`,
    `on_lost=None`: as for Lock. An acquire with a `limit` different from the live one raises
    SemaphoreLimitError naming both.
    """

    def __new__(
        cls,
        client: ClientLike,
        name: str,
        limit: int,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        fair: bool | None = None,
        auto_renew: bool | None = None,
        on_lost: Callable[[Semaphore], object] | None = None,
    ) -> Self: ...
    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Takes one of the `limit` places; True when acquired, False when the wait ended.

        `blocking`: None or True waits, False tries once. `timeout`: None means the
        constructor's timeout (whose default None waits forever), `math.inf` forever, 0 once.
        """
    def release(self) -> None:
        """Gives the place back. LockNotOwnedError when this object holds none, LockLostError
        when its lease expired."""
    def extend(self, ttl: float | None = None) -> None:
        """This holder's lease now ends `ttl` seconds from now (None: the semaphore's ttl)."""
    def holders(self) -> int:
        """The number of live holders."""
    def owned(self) -> bool:
        """True when this object holds a place, checked against Redis."""
    def remaining(self) -> float | None:
        """Seconds left on this object's lease; None when not held."""
    @property
    def token(self) -> str | None:
        """The identifier of this object's hold, None when not held."""
    @property
    def lost(self) -> bool:
        """True once this hold was found lost."""
    @property
    def name(self) -> str:
        """The semaphore's name."""
    @property
    def limit(self) -> int:
        """The most holders at once."""
    @property
    def ttl(self) -> float:
        """Each holder's lease in seconds."""
    @property
    def fair(self) -> bool:
        """True when waiters are served in arrival order."""
    @property
    def client(self) -> Client:
        """The Client this semaphore talks through."""
    def __enter__(self) -> Self:
        """Acquires with the constructor's timeout; LockTimeoutError when not acquired."""
    def __exit__(self, *exc: object) -> Literal[False]:
        """Releases; LockLostError if the lease was lost while the block ran. A release that
        raised (ConnectionError) still ends the hold here: it goes on in the background until
        the lease would end."""
    # Awaited by redmutex.aio.Semaphore; same semantics as the blocking methods.
    def _acquire_async(
        self, blocking: bool | None = None, timeout: float | None = None
    ) -> asyncio.Future[bool]: ...
    def _enter_async(self) -> asyncio.Future[None]: ...
    def _release_async(self) -> asyncio.Future[None]: ...
    def _give_back(self, token: str) -> bool: ...
    def _stop_renewal(self, token: str) -> bool: ...
    def _release_abandoned(self) -> bool: ...
    def _extend_async(self, ttl: float | None = None) -> asyncio.Future[None]: ...
    def _extend_settling(self) -> bool: ...
    def _owned_async(self) -> asyncio.Future[bool]: ...
    def _holders_async(self) -> asyncio.Future[int]: ...
    def _exit_async(self, body_raised: bool) -> asyncio.Future[bool]: ...

@final
class RWLock:
    """A read-write lock: `with rw.read(): ...` (many readers) or `with rw.write(): ...` (one
    writer, no readers; a waiting writer holds back new readers).

    Writer-preferring: while a writer holds the write lock or waits for it, no new reader gets
    in (readers already in keep their locks, and the writer waits for them), so readers that
    keep arriving never starve a writer. The other side of it: a reader gets in only at a moment
    when no writer holds or waits, so writers that follow each other without a gap starve
    readers (two writers each holding 50 ms every 55 ms keep a reader out for as long as they
    go on; its `acquire(timeout=...)` returns False). When readers must get through: leave
    such moments (batch or coalesce writes, or have each writer pause after its release for
    longer than the other writers hold), bound the readers' wait with a timeout and fall back
    (e.g. a stale value), or, to serve readers and writers in arrival order, use one
    `Lock(..., fair=True)` for both (readers then no longer share).

    `ttl: float = 10.0`: each side's lease. `timeout: float | None = None`: the default wait;
    None waits forever, 0 tries once. `auto_renew=False`, `on_lost=None` (called with the
    RWLockSide): as for Lock. A thread that holds a read lock gets another read at once, even
    while a writer waits, and a read->write upgrade (or any acquire while it holds the write
    lock) raises LockError instead of waiting for itself: through this RWLock object or any
    other of the same client and name (a function that makes its own `RWLock(client, name)`
    on each call). Through another client it is another reader, who waits behind that writer
    (without a timeout, for ever).
    A writer that dies while waiting stops holding readers back within its ttl (at least 1 s,
    at most 6 s; on Redlock 6 s).
    """

    def __new__(
        cls,
        client: ClientLike,
        name: str,
        *,
        ttl: float = 10.0,
        timeout: float | None = None,
        auto_renew: bool | None = None,
        on_lost: Callable[[RWLockSide], object] | None = None,
    ) -> Self: ...
    def read(self) -> RWLockSide:
        """A new read lock of this RWLock (shared with other readers; it waits while a writer
        holds or waits for the write lock)."""
    def write(self) -> RWLockSide:
        """A new write lock of this RWLock (exclusive)."""
    def locked(self) -> bool:
        """True when somebody holds the RWLock: a writer, or at least one live reader."""
    def readers(self) -> int:
        """The number of live readers."""
    @property
    def name(self) -> str:
        """The RWLock's name."""
    @property
    def ttl(self) -> float:
        """Each side's lease in seconds."""
    @property
    def auto_renew(self) -> bool:
        """True when held sides renew their lease in the background."""
    @property
    def client(self) -> Client:
        """The Client this RWLock talks through."""
    # Awaited by redmutex.aio.RWLock.
    def _locked_async(self) -> asyncio.Future[bool]: ...
    def _readers_async(self) -> asyncio.Future[int]: ...

@final
class RWLockSide:
    """The read or the write lock of an RWLock (made by `RWLock.read()` / `RWLock.write()`),
    with the acquire/release/extend/owned methods and `with` behaviour of Lock."""

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Takes this side; True when acquired, False when the wait ended first.

        `blocking`: None or True waits, False tries once. `timeout`: None means the RWLock's
        timeout (whose default None waits forever), `math.inf` forever, 0 once.
        """
    def release(self) -> None:
        """Releases this side; LockNotOwnedError / LockLostError as for Lock.release()."""
    def extend(self, ttl: float | None = None) -> None:
        """This side's lease now ends `ttl` seconds from now (None: the RWLock's ttl)."""
    def locked(self) -> bool:
        """True when somebody holds the RWLock: a writer, or at least one live reader (the same
        answer on either side)."""
    def owned(self) -> bool:
        """True when this object holds its side, checked against Redis."""
    def remaining(self) -> float | None:
        """Seconds left on this side's lease; None when not held."""
    @property
    def token(self) -> str | None:
        """The identifier of this side's hold, None when not held."""
    @property
    def lost(self) -> bool:
        """True once this hold was found lost."""
    @property
    def mode(self) -> Literal["read", "write"]:
        """ "read" or "write"."""
    @property
    def name(self) -> str:
        """The RWLock's name."""
    @property
    def ttl(self) -> float:
        """The lease in seconds."""
    @property
    def rwlock(self) -> RWLock:
        """The RWLock this side belongs to."""
    def __enter__(self) -> Self:
        """Acquires with the RWLock's timeout; LockTimeoutError when not acquired."""
    def __exit__(self, *exc: object) -> Literal[False]:
        """Releases; LockLostError if the lease was lost while the block ran. A release that
        raised (ConnectionError) still ends the hold here: it goes on in the background until
        the lease would end."""
    # Awaited by redmutex.aio.RWLockSide; `context` tells asyncio tasks apart for the
    # deadlock guard (a read->write upgrade within one task raises LockError).
    def _acquire_async(
        self, context: int, blocking: bool | None = None, timeout: float | None = None
    ) -> asyncio.Future[bool]: ...
    def _enter_async(self, context: int) -> asyncio.Future[None]: ...
    def _release_async(self) -> asyncio.Future[None]: ...
    def _give_back(self, token: str) -> bool: ...
    def _stop_renewal(self, token: str) -> bool: ...
    def _release_abandoned(self) -> bool: ...
    def _extend_async(self, ttl: float | None = None) -> asyncio.Future[None]: ...
    def _extend_settling(self) -> bool: ...
    def _owned_async(self) -> asyncio.Future[bool]: ...
    def _locked_async(self) -> asyncio.Future[bool]: ...
    def _exit_async(self, body_raised: bool) -> asyncio.Future[bool]: ...

@final
class CacheHit:
    """A stored value, as CacheStore.fetch/try_claim found it."""

    @property
    def payload(self) -> bytes:
        """The stored payload."""
    @property
    def pttl_ms(self) -> int:
        """The ms the value had left when read (Redis's clock); -1: no expiry."""

# What CacheStore.fetch/try_claim found: a stored value; the fill claim, held by the caller (it
# fills, then stores or abandons); or None: another caller fills, and the wait allowed ended first.
_Found: TypeAlias = CacheHit | FillClaim | None

@final
class CacheStore:
    """The Redis steps of one get_or_fill/@cached (redmutex._cache does the rest)."""

    def __new__(
        cls,
        client: ClientLike,
        *,
        ttl: float,
        lock_ttl: float = 10.0,
        timeout: float | None = None,
    ) -> Self: ...
    def fetch(self, key: str, skip: str | None = None, *, timeout: float | None = None) -> _Found:
        """Look up `key`; on a miss claim its fill or wait for another caller's (at most
        `timeout`, default the store's). `skip`: SHA-1 hex of a payload that counts as absent."""
    def try_claim(self, key: str, seen: str) -> _Found:
        """The early-refresh claim, never waiting, taken only if the payload with SHA-1 `seen`
        is still the stored one (or none is)."""
    def invalidate(self, key: str) -> bool:
        """Drops the value of `key` (and any fill in progress); True when a value was dropped."""
    def _fetch_async(
        self, key: str, skip: str | None = None, *, timeout: float | None = None
    ) -> asyncio.Future[_Found]: ...
    def _try_claim_async(self, key: str, seen: str) -> asyncio.Future[_Found]: ...
    def _invalidate_async(self, key: str) -> asyncio.Future[bool]: ...
    def holds_claim(self, key: str, token: str) -> bool:
        """Whether the fill claim of `key` is held with `token` (a FillClaim's)."""
    def _holds_claim_async(self, key: str, token: str) -> asyncio.Future[bool]: ...
    @property
    def client(self) -> Client:
        """The Client of the store."""
    @property
    def ttl(self) -> float:
        """How long a stored value lives, in seconds."""
    @property
    def lock_ttl(self) -> float:
        """The lease of a fill claim, in seconds."""
    @property
    def timeout(self) -> float | None:
        """How long to wait for another caller's fill; None: forever."""

@final
class FillClaim:
    """The fill claim of one cache entry (renewed while held); settled by store or abandon."""

    def store(self, payload: bytes) -> bool:
        """Stores `payload` and ends the claim; False when the claim was lost meanwhile."""
    def abandon(self) -> bool:
        """Ends the claim without a value (a waiting caller takes the fill over)."""
    def _store_async(self, payload: bytes) -> asyncio.Future[bool]: ...
    def _abandon_async(self) -> asyncio.Future[bool]: ...
    @property
    def held(self) -> bool:
        """True until stored or abandoned."""
    @property
    def token(self) -> str:
        """The claim's owner identifier."""
    @property
    def lapsed(self) -> bool:
        """After a refused store: True when the claim's lease had run out before it."""

def acquire_token(
    conn: ClientLike,
    lockname: str,
    identifier: str,
    atime: float,
    ltime: float,
    *,
    drawn: bool = False,
) -> int | None:
    """Takes `lockname` for `identifier`; the fence, or None when not acquired within `atime`.
    `drawn`: the identifier was drawn at random for this call, so an attempt whose outcome is
    unknown is given back."""

def release_token(conn: ClientLike, lockname: str, identifier: str) -> bool:
    """Compare-and-delete for `identifier`; False when it did not hold the lock."""

def _interpreter_exiting() -> None: ...
def _aio_calls() -> tuple[int, int]:
    """(calls served by the asyncio loop path, operations run on the runtime) so far."""

def _waiting_attempts() -> int:
    """Attempts made by waiting acquires so far (first attempts not counted)."""

def _woken_waits() -> list[int]:
    """The cooperative waits of this thread woken since the last call (gevent)."""

def _caller() -> int:
    """The calling thread (or greenlet, once gevent patched `threading`) as a number never
    reused in this process."""

def _loop_cancelled(future: asyncio.Future[Any]) -> None:
    """An acquire's awaitable was cancelled: its attempt out on the loop path gives back what it
    takes."""

# -- for the drop-in shims (redmutex.compat): a lock on another library's key, caller's token

@final
class _CompatHold:
    @property
    def fence(self) -> int: ...
    @property
    def lost(self) -> bool: ...
    def stop(self) -> None: ...

@final
class _CompatLock:
    def __new__(
        cls,
        client: ClientLike,
        name: str,
        lock_key: bytes,
        *,
        signal: bytes | None = None,
        signal_expire_ms: int = 1000,
    ) -> _CompatLock: ...
    def acquire(
        self,
        token: str,
        lease: float,
        timeout: float | None,
        chosen: bool,
        renew: bool,
        poll: float | None = None,
    ) -> _CompatHold | None: ...
    def _acquire_async(
        self,
        token: str,
        lease: float,
        timeout: float | None,
        chosen: bool,
        renew: bool,
        poll: float | None = None,
    ) -> Awaitable[_CompatHold | None]: ...
    def _give_back(self, token: str, lease: float) -> None: ...
    def release(self, token: str) -> bool: ...
    def _release_async(self, token: str) -> Awaitable[bool]: ...
    def extend(self, token: str, ms: int, replace: bool) -> int: ...
    def _extend_async(self, token: str, ms: int, replace: bool) -> Awaitable[int]: ...
    def owner(self) -> bytes | None: ...
    def _owner_async(self) -> Awaitable[bytes | None]: ...
    def reset(self) -> int: ...

# -- for the command line (redmutex._cli): the core's key layout, URLs, redaction, force release

# What `_parse_url` reads: hosts ([(host, port)]: the server, or the sentinels), socket,
# service (Sentinel), db, username, password, sentinel_username, sentinel_password, tls,
# insecure, ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_verify_peer, ssl_check_hostname.
_UrlParts: TypeAlias = dict[str, Any]
# (lock holder's token, live semaphore holders, writer's token, live readers, fill claim's token,
# live waiting writers' places)
_Freed: TypeAlias = tuple[bytes | None, int, bytes | None, int, bytes | None, int]

def _keys(prefix: str, name: str | bytes) -> dict[str, bytes]:
    """`{role: key}` of every key of `name` under `prefix`, plus "wake_channel"."""

def _script_source(name: str) -> str:
    """The exact source of the script `name` (its file's stem under src/protocol/lua/), as sent."""

def _split_key(prefix: str, key: bytes) -> tuple[bytes, str, str] | None:
    """(name, kind, role) of a key of redmutex under `prefix`, or None."""

def _hold_count(value: bytes | None, owner: bytes) -> int:
    """The hold count of a re-entrant lock held by `owner`, from its `lock_holds` key's value."""

def _kinds() -> list[str]:
    """The kinds of primitive, in the order the command line lists them."""

def _scan_pattern(prefix: str) -> bytes:
    """The SCAN pattern of every key under `prefix`."""

def _redact_url(url: str) -> str:
    """`url` with its password(s) replaced by `***`."""

def _redact_text(text: str, urls: list[str] = ...) -> str:
    """`text` on one line, without the passwords of `urls` and with every URL in it redacted."""

def _parse_url(url: str) -> _UrlParts:
    """What `url` connects to (ValueError, the URL redacted, when a Client would refuse it)."""

def _force_release(client: ClientLike, name: str, expected: bytes = ...) -> _Freed | None:
    """Frees everything held under `name` and wakes its waiters; None when the lock's holder was
    not `expected` (b"": whoever holds it)."""
