"""Turning what users pass as `client` into a `redmutex.Client`.

A `Client`, a URL string, or a redis-py `redis.Redis` (whose host, port, db, username, password,
TLS and unix-socket settings are reused; the Rust core opens its own connections).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any
from urllib.parse import quote, urlencode

from ._core import Client

_from_redis_cache: weakref.WeakKeyDictionary[Any, Client] = weakref.WeakKeyDictionary()
# URL strings passed as `client` share one Client (and its connections) per URL.
_by_url: dict[str, Client] = {}
_BY_URL_KEPT = 64
_cache_lock = threading.Lock()


def _userinfo(username: str | None, password: str | None) -> str:
    if not username and not password:
        return ""
    user = quote(username or "", safe="")
    if password is None:
        return f"{user}@"
    return f"{user}:{quote(str(password), safe='')}@"


def url_of_redis_py(redis_client: Any) -> tuple[str, float | None, float | None]:
    """The URL (and timeouts, if set) of a redis-py client's connection pool."""
    pool = getattr(redis_client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        raise TypeError("client: expected a redmutex.Client, a URL string or a redis.Redis")
    db = int(kwargs.get("db") or 0)
    username = kwargs.get("username")
    password = kwargs.get("password")
    path = kwargs.get("path")
    if path:
        query = {"db": str(db)}
        if username:
            query["user"] = username
        if password is not None:
            query["pass"] = str(password)
        url = f"unix://{quote(path)}?{urlencode(query)}"
    else:
        connection_class = getattr(pool, "connection_class", None)
        tls = "SSL" in getattr(connection_class, "__name__", "")
        scheme = "rediss" if tls else "redis"
        host = kwargs.get("host") or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        port = int(kwargs.get("port") or 6379)
        url = f"{scheme}://{_userinfo(username, password)}{host}:{port}/{db}"
        if tls and kwargs.get("ssl_cert_reqs") in ("none", None, 0):
            url += "#insecure"
    return url, kwargs.get("socket_connect_timeout"), kwargs.get("socket_timeout")


def from_redis(redis_client: Any, prefix: str = "redmutex:") -> Client:
    """A Client on the same server as a redis-py client; one per redis-py instance is reused."""
    with _cache_lock:
        try:
            cached = _from_redis_cache.get(redis_client)
        except TypeError:
            cached = None
        if cached is not None and cached.prefix == prefix:
            return cached
    url, connect_timeout, command_timeout = url_of_redis_py(redis_client)
    options: dict[str, Any] = {"prefix": prefix}
    if isinstance(connect_timeout, (int, float)) and connect_timeout > 0:
        options["connect_timeout"] = float(connect_timeout)
    if isinstance(command_timeout, (int, float)) and command_timeout > 0:
        options["command_timeout"] = float(command_timeout)
    client = Client(url, **options)
    with _cache_lock:
        try:
            _from_redis_cache[redis_client] = client
        except TypeError:
            pass
    return client


def coerce(obj: Any) -> Client:
    """The `client` argument of every primitive, as a Client."""
    if isinstance(obj, Client):
        return obj
    if isinstance(obj, str):
        with _cache_lock:
            found = _by_url.get(obj)
        if found is not None:
            return found
        client = Client(obj)
        with _cache_lock:
            if len(_by_url) >= _BY_URL_KEPT:
                _by_url.pop(next(iter(_by_url)))
            return _by_url.setdefault(obj, client)
    if hasattr(obj, "connection_pool"):
        return from_redis(obj)
    raise TypeError(
        f"client: expected a redmutex.Client, a URL string or a redis.Redis, "
        f"not {type(obj).__name__}"
    )
