"""The libraries under comparison ("peers"), each behind the same tiny interface.

A peer opens a `Session` for a Redis URL; a session hands out primitives by capability:
`lock` (every lock peer), `semaphore` and `rwlock` (redmutex only: no peer has them). Scenarios
only ever talk to these interfaces, so a new peer is one `register(Peer(...))` here, and a
scenario declares the capability it needs. Peers are looked up by name, so a scenario that runs
in worker processes passes `(peer name, url)` and the worker reopens the session there.

Every handle's `acquire()` blocks for at most the `wait` it was made with and returns False
when that ran out, so no benchmark loop can hang on a lock that never comes.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

WAIT = 30.0  # seconds: the longest any benchmark acquire() may wait


class LockHandle(Protocol):
    def acquire(self) -> Any: ...
    def release(self) -> Any: ...


class Session(Protocol):
    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Peer:
    name: str
    label: str  # how the table names it, including the call measured
    capabilities: frozenset[str]
    open: Callable[[str], Any]  # url -> a Session (with the methods its capabilities need)
    probe: Callable[[], str | None]  # None when usable, else the reason why not
    info: Callable[[], dict[str, Any]] = field(default=dict)
    required: bool = True  # a required peer that is unavailable fails the run


PEERS: dict[str, Peer] = {}


def register(peer: Peer) -> Peer:
    PEERS[peer.name] = peer
    return peer


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_import(module: str, install: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"not installed ({exc}); `.venv/bin/pip install {install}`"
        return None

    return probe


# --- redmutex ------------------------------------------------------------------------------


class _RedmutexSession:
    """redmutex: `fair` selects the mode of every Lock this session hands out."""

    def __init__(self, url: str, *, fair: bool = False) -> None:
        import redmutex

        self._redmutex = redmutex
        self._fair = fair
        self.client = redmutex.Client(url)

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        return self._redmutex.Lock(self.client, name, ttl=ttl, timeout=wait, fair=self._fair)

    def semaphore(
        self, name: str, limit: int, ttl: float, *, fair: bool = True, wait: float = WAIT
    ) -> LockHandle:
        return self._redmutex.Semaphore(self.client, name, limit, ttl=ttl, timeout=wait, fair=fair)

    def rwlock_read(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        return self._redmutex.RWLock(self.client, name, ttl=ttl, timeout=wait).read()

    def rwlock_write(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        return self._redmutex.RWLock(self.client, name, ttl=ttl, timeout=wait).write()

    def close(self) -> None:
        self.client.close()


def _probe_redmutex() -> str | None:
    try:
        import redmutex

        redmutex.Lock  # noqa: B018 - the extension is built only if this resolves
        redmutex.Client  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return f"redmutex is not built ({type(exc).__name__}: {exc}); run `make build`"
    return None


register(
    Peer(
        name="redmutex",
        label="redmutex `Lock(client, name, ttl=10)`",
        capabilities=frozenset({"lock", "semaphore", "rwlock"}),
        open=_RedmutexSession,
        probe=_probe_redmutex,
        info=lambda: {"version": _version("redmutex")},
    )
)

register(
    Peer(
        name="redmutex-fair",
        label="redmutex `Lock(client, name, ttl=10, fair=True)`",
        capabilities=frozenset({"lock"}),
        open=lambda url: _RedmutexSession(url, fair=True),
        probe=_probe_redmutex,
        info=lambda: {"version": _version("redmutex")},
    )
)


# --- redis-py ------------------------------------------------------------------------------


class _RedisPySession:
    """redis-py's `Lock`: SET NX PX, then a retry every `sleep` seconds while it is taken."""

    def __init__(self, url: str, *, sleep: float | None = None) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self._sleep = sleep

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        if self._sleep is None:  # the library's default (0.1 s), not restated here
            return self.client.lock(name, timeout=ttl, blocking_timeout=wait)
        return self.client.lock(name, timeout=ttl, sleep=self._sleep, blocking_timeout=wait)

    def close(self) -> None:
        self.client.close()


def _redis_py_info() -> dict[str, Any]:
    import redis.utils

    return {
        "version": _version("redis"),
        # redis.utils.HIREDIS_AVAILABLE: the C parser is what makes redis-py a fair peer
        "hiredis_available": bool(redis.utils.HIREDIS_AVAILABLE),
        "hiredis_version": _version("hiredis"),
    }


register(
    Peer(
        name="redis-py",
        label="redis-py `Redis().lock(name, timeout=10)` (sleep=0.1 s, the default)",
        capabilities=frozenset({"lock"}),
        open=_RedisPySession,
        probe=_probe_import("redis", "redis hiredis"),
        info=_redis_py_info,
    )
)

register(
    Peer(
        name="redis-py-1ms",
        label="redis-py `Redis().lock(name, timeout=10, sleep=0.001)`",
        capabilities=frozenset({"lock"}),
        open=lambda url: _RedisPySession(url, sleep=0.001),
        probe=_probe_import("redis", "redis hiredis"),
        info=_redis_py_info,
        required=False,
    )
)


# --- the raw hand-off reference -------------------------------------------------------------


class _RawPubSubHandle:
    """A reference, not a library: plain redis-py SET NX PX to take the name, DEL + PUBLISH (one
    pipelined round trip) to give it back, and a waiter that is SUBSCRIBEd to the name's channel
    and blocks on its socket for the next message between tries. What a hand-off between two
    processes costs at the least: the release's round trip, the message, one more SET NX."""

    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        import secrets

        self._client = client
        self._name = name
        self._channel = f"{name}:raw-wake"
        self._ttl_ms = max(1, round(ttl * 1000))
        self._wait = wait
        self._token = secrets.token_hex(8)
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(self._channel)
        self._pubsub.get_message(timeout=1.0)  # the subscription is in place before any try
        self._release = client.pipeline(transaction=False)

    def acquire(self) -> bool:
        import time

        deadline = time.monotonic() + self._wait
        get_message, try_set = self._pubsub.get_message, self._client.set
        while True:
            if try_set(self._name, self._token, nx=True, px=self._ttl_ms):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            get_message(timeout=min(left, self._ttl_ms / 1000))

    def release(self) -> None:
        pipe = self._release
        pipe.delete(self._name)
        pipe.publish(self._channel, b"")
        pipe.execute()


class _RawPubSubSession:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        return _RawPubSubHandle(self.client, name, ttl, wait)

    def close(self) -> None:
        self.client.close()


register(
    Peer(
        name="raw-pubsub",
        label="reference: redis-py SET NX PX / DEL + PUBLISH, waiter SUBSCRIBEd (no library)",
        # Only the hand-off scenarios take it (`Scenario.reference`): a floor to measure the
        # unfair lock's hand-off against, not a lock to rank (DEL without an owner check).
        capabilities=frozenset({"raw-handoff"}),
        open=_RawPubSubSession,
        probe=_probe_import("redis", "redis hiredis"),
        info=_redis_py_info,
        required=False,
    )
)


# --- python-redis-lock ---------------------------------------------------------------------


class _PythonRedisLockHandle:
    """`redis_lock.Lock`: SET NX EX, then BLPOP on a signal list that release pushes to."""

    def __init__(self, lock: Any, wait: int) -> None:
        self._lock = lock
        self._wait = wait

    def acquire(self) -> bool:
        return bool(self._lock.acquire(timeout=self._wait))

    def release(self) -> None:
        self._lock.release()


class _PythonRedisLockSession:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        import redis_lock

        expire = max(1, round(ttl))  # whole seconds only
        # it refuses a timeout longer than the lease (TimeoutTooLarge) without auto_renewal
        return _PythonRedisLockHandle(
            redis_lock.Lock(self.client, name, expire=expire), max(1, min(expire, round(wait)))
        )

    def close(self) -> None:
        self.client.close()


register(
    Peer(
        name="python-redis-lock",
        label="python-redis-lock `redis_lock.Lock(Redis(), name, expire=10)`",
        capabilities=frozenset({"lock"}),
        open=_PythonRedisLockSession,
        probe=_probe_import("redis_lock", "python-redis-lock"),
        info=lambda: {"version": _version("python-redis-lock")},
        required=False,
    )
)


# --- redmutex.compat: the drop-in shims, through the originals' own call sites ----------------


class _CompatRedisPySession:
    """`redmutex.compat.redis_py.lock(r, ...)`: redis-py's call, redmutex's engine."""

    def __init__(self, url: str) -> None:
        import redis
        from redmutex.compat import redis_py

        self._lock = redis_py.lock
        self.client = redis.Redis.from_url(url)

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        return self._lock(self.client, name, timeout=ttl, blocking_timeout=wait)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.client.close()


class _CompatRedisLockSession(_PythonRedisLockSession):
    """`redmutex.compat.redis_lock.Lock(r, ...)`: python-redis-lock's call, redmutex's engine."""

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        from redmutex.compat import redis_lock

        expire = max(1, round(ttl))
        return _PythonRedisLockHandle(
            redis_lock.Lock(self.client, name, expire=expire), max(1, min(expire, round(wait)))
        )


def _probe_compat(module: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        reason = _probe_redmutex()
        if reason is not None:
            return reason
        return _probe_import(module, "redis python-redis-lock")()

    return probe


register(
    Peer(
        name="compat-redis-py",
        label="redmutex.compat.redis_py `lock(Redis(), name, timeout=10)` (shim)",
        capabilities=frozenset({"lock"}),
        open=_CompatRedisPySession,
        probe=_probe_compat("redmutex.compat.redis_py"),
        info=lambda: {"version": _version("redmutex")},
        required=False,
    )
)

register(
    Peer(
        name="compat-redis-lock",
        label="redmutex.compat.redis_lock `Lock(Redis(), name, expire=10)` (shim)",
        capabilities=frozenset({"lock"}),
        open=_CompatRedisLockSession,
        probe=_probe_compat("redmutex.compat.redis_lock"),
        info=lambda: {"version": _version("redmutex")},
        required=False,
    )
)


# --- pottery -------------------------------------------------------------------------------


class _PotteryHandle:
    """pottery's `Redlock` on one master: SET NX PX, retried after a random 0-0.2 s sleep."""

    def __init__(self, lock: Any, wait: float) -> None:
        self._lock = lock
        self._wait = wait

    def acquire(self) -> bool:
        return bool(self._lock.acquire(timeout=self._wait))

    def release(self) -> None:
        self._lock.release()


class _PotterySession:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def lock(self, name: str, ttl: float, wait: float = WAIT) -> LockHandle:
        from pottery import Redlock

        return _PotteryHandle(Redlock(key=name, masters={self.client}, auto_release_time=ttl), wait)

    def close(self) -> None:
        self.client.close()


register(
    Peer(
        name="pottery",
        label="pottery `Redlock(key=name, masters={Redis()}, auto_release_time=10)`",
        capabilities=frozenset({"lock"}),
        open=_PotterySession,
        probe=_probe_import("pottery", "pottery"),
        info=lambda: {"version": _version("pottery")},
        required=False,
    )
)
