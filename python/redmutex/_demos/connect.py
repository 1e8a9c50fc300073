"""The demos' redis-py clients, made from the URL as redmutex reads it."""

from __future__ import annotations

from typing import Any

from redmutex._cli import redis_kwargs
from redmutex._core import _parse_url


def server_settings(url: str) -> dict[str, Any]:
    """What redmutex reads of `url`, one server's: a ValueError naming `url` otherwise."""
    parts: dict[str, Any] = _parse_url(url)
    if parts["service"] is not None:
        raise ValueError("url: the demo needs one Redis server's URL, not a Sentinel's")
    return parts


def redis_py_client(cls: Any, url: str, socket_timeout: float) -> Any:
    """A redis-py client (`cls`) of `url` as redmutex reads it: every form a `Client` takes, the
    raw password form (`redis://:se/cret@host/0`, whose user-info runs to the last `@`)
    included, which redis-py's own `from_url` reads otherwise (it took part of such a password
    for the host, and the demo printed it)."""
    kwargs = redis_kwargs(server_settings(url))
    kwargs["socket_connect_timeout"] = 5
    kwargs["socket_timeout"] = socket_timeout
    return cls(**kwargs)
