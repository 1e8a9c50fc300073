"""The libraries under comparison ("peers"), each behind the same tiny interface.

A peer opens a `Session` for a Redis URL; a session hands out primitives by capability
(`lock` today; `semaphore`, `cache`... later). Scenarios only ever talk to these interfaces, so a
new peer (python-redis-lock, pottery, dogpile.cache) is one `register(Peer(...))` here, and a
scenario declares the capability it needs. Peers are looked up by name, so a scenario that runs
in child processes can pass `(peer name, url)` and reopen the session there.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class LockHandle(Protocol):
    def acquire(self) -> Any: ...
    def release(self) -> Any: ...


class Session(Protocol):
    def lock(self, name: str, ttl: float) -> LockHandle: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Peer:
    name: str
    label: str  # how the table names it, including the call measured
    capabilities: frozenset[str]
    open: Callable[[str], Session]
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


# --- redmutex ------------------------------------------------------------------------------


class _RedmutexSession:
    def __init__(self, url: str) -> None:
        import redmutex

        self._redmutex = redmutex
        self.client = redmutex.Client(url)

    def lock(self, name: str, ttl: float) -> LockHandle:
        return self._redmutex.Lock(self.client, name, ttl=ttl)

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
        capabilities=frozenset({"lock"}),
        open=_RedmutexSession,
        probe=_probe_redmutex,
        info=lambda: {"version": _version("redmutex")},
    )
)


# --- redis-py ------------------------------------------------------------------------------


class _RedisPySession:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def lock(self, name: str, ttl: float) -> LockHandle:
        return self.client.lock(name, timeout=ttl)

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


def _probe_redis_py() -> str | None:
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed"
    return None


register(
    Peer(
        name="redis-py",
        label="redis-py `Redis().lock(name, timeout=10)`",
        capabilities=frozenset({"lock"}),
        open=_RedisPySession,
        probe=_probe_redis_py,
        info=_redis_py_info,
    )
)
