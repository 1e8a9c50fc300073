"""What the shims share: one redmutex Client per redis-py connection pool, and key encoding."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .. import Client
from .._client import from_redis

#: The lease of a hold the original library keeps without expiry: renewed every third of it
#: while the holder lives, so it ends within this time of the holder's death.
NO_EXPIRY_LEASE = 10.0

_by_pool: weakref.WeakKeyDictionary[Any, Client] = weakref.WeakKeyDictionary()
_by_pool_lock = threading.Lock()


def client_of(redis: Any) -> Client:
    """The redmutex Client on the server of a redis-py client (sync or asyncio), shared by every
    shim lock built on the same connection pool."""
    pool = getattr(redis, "connection_pool", None)
    if pool is not None:
        with _by_pool_lock:
            try:
                found = _by_pool.get(pool)
            except TypeError:
                found = None
        if found is not None:
            return found
    client = from_redis(redis)
    if pool is not None:
        with _by_pool_lock:
            try:
                return _by_pool.setdefault(pool, client)
            except TypeError:
                pass
    return client


def encode(redis: Any, value: str | bytes | float) -> bytes:
    """A key or value as the redis-py client would send it (its encoder, UTF-8 by default)."""
    if isinstance(value, bytes):
        return value
    encoder = None
    for owner in (redis, getattr(redis, "connection_pool", None)):
        getter = getattr(owner, "get_encoder", None)
        if getter is not None:
            try:
                encoder = getter()
                break
            except Exception:  # noqa: BLE001 - a client without an encoder: use UTF-8
                encoder = None
    if encoder is not None:
        encoded = encoder.encode(value)
        if isinstance(encoded, bytes):
            return encoded
    return str(value).encode("utf-8")


def key_name(key: bytes) -> str:
    """The name of redmutex's own keys beside a shim's lock key (fence, wake-up channel)."""
    return key.decode("utf-8", "backslashreplace")


def token_text(token: bytes, what: str = "token") -> str:
    """A token as the engine takes it (text); redis-py's and python-redis-lock's are ASCII."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what}: must be valid UTF-8 to be used by redmutex.compat") from None
