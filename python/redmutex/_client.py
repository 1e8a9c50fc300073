"""Turning what users pass as `client` into a `redmutex.Client`.

A `Client`, a URL string, or a redis-py `redis.Redis` (whose host, port, db, username, password,
TLS (CA, client certificate, checks: as `?ssl_...` URL options) and unix-socket settings are
reused; the Rust core opens its own connections).
"""

from __future__ import annotations

import inspect
import os
import ssl
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


def _query(query: dict[str, str]) -> str:
    """A URL query with a space as %20, which every parser reads as a space (urlencode's
    default '+' is one only to a parser that reads the query as a form)."""
    return urlencode(query, quote_via=quote)


def _userinfo(username: str | None, password: str | None) -> str:
    if not username and not password:
        return ""
    user = quote(username or "", safe="")
    if password is None:
        return f"{user}@"
    return f"{user}:{quote(str(password), safe='')}@"


def _host_port(host: str | None, port: int | None, default_port: int) -> str:
    host = host or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(port or default_port)}"


def _is_tls(connection_class: Any) -> bool:
    return "SSL" in getattr(connection_class, "__name__", "")


def _sentinel_url(
    pool: Any, kwargs: dict[str, Any], username: str | None, password: str | None
) -> str | None:
    """A redis+sentinel:// (rediss+sentinel:// over TLS) URL for a redis-py client made by
    `Sentinel.master_for(...)`."""
    manager = getattr(pool, "sentinel_manager", None)
    service = getattr(pool, "service_name", None)
    if manager is None or not isinstance(service, str):
        return None
    # A Sentinel URL has one TLS setting for the sentinels and the master: both sides of the
    # redis-py client must agree on it, or it cannot be expressed (and is refused, so that no
    # password goes out in cleartext where redis-py would have used TLS).
    master_tls = _tls_side(kwargs, getattr(pool, "connection_class", None))
    hosts = []
    for sentinel in getattr(manager, "sentinels", []):
        spool = getattr(sentinel, "connection_pool", None)
        skw = getattr(spool, "connection_kwargs", {})
        hosts.append(_host_port(skw.get("host"), skw.get("port"), 26379))
        if _tls_side(skw, getattr(spool, "connection_class", None)) != master_tls:
            raise ValueError(
                "client: this redis-py Sentinel client uses TLS settings for the sentinels "
                "(sentinel_kwargs) unlike the master's (master_for); redmutex takes one TLS "
                "setting for both"
            )
    if not hosts:
        return None
    scheme = "redis+sentinel" if master_tls is None else "rediss+sentinel"
    # The CA, client certificate and hostname check go into the query (for both sides).
    query = dict(master_tls or {})
    fragment = "#insecure" if query.pop("ssl_cert_reqs", None) == "none" else ""
    db = int(kwargs.get("db") or 0)
    userinfo = _userinfo(username, password)
    sentinel_kwargs = getattr(manager, "sentinel_kwargs", None) or {}
    sentinel_username, sentinel_password = _credentials(sentinel_kwargs)
    if sentinel_username:
        query["sentinel_username"] = sentinel_username
    if sentinel_password is not None:
        query["sentinel_password"] = sentinel_password
    tail = f"?{_query(query)}" if query else ""
    path = f"{quote(service, safe='')}/{db}"
    return f"{scheme}://{userinfo}{','.join(hosts)}/{path}{tail}{fragment}"


def cluster_urls_of_redis_py(redis_client: Any) -> list[str] | None:
    """The node URLs of a redis-py `RedisCluster`, or None for anything else."""
    get_nodes = getattr(redis_client, "get_nodes", None)
    manager = getattr(redis_client, "nodes_manager", None)
    if get_nodes is None or manager is None:
        return None
    kwargs = getattr(manager, "connection_kwargs", None) or {}
    # Sync clusters keep ssl=True, asyncio ones the SSLConnection class.
    connection_class = kwargs.get("connection_class")
    tls = bool(kwargs.get("ssl")) or _is_tls(connection_class)
    settings = _tls_settings(kwargs, connection_class) if tls else {}
    scheme = "rediss" if tls else "redis"
    # Each seed carries the same settings (as a single server's URL would).
    query = dict(settings)
    fragment = "#insecure" if query.pop("ssl_cert_reqs", None) == "none" else ""
    tail = f"?{_query(query)}" if query else ""
    userinfo = _userinfo(*_credentials(kwargs))
    # An asyncio RedisCluster knows no nodes before its first command: its seeds then.
    nodes = list(get_nodes()) or list(getattr(manager, "startup_nodes", {}).values())
    return [
        f"{scheme}://{userinfo}{_host_port(node.host, node.port, 6379)}/0{tail}{fragment}"
        for node in nodes
        if getattr(node, "server_type", None) != "replica"
    ]


# redis-py TLS settings that have no counterpart here: refused rather than dropped (dropped,
# redmutex would connect where redis-py refuses). Their redis-py defaults are all None/False.
_UNSUPPORTED_TLS = (
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_password",
    "ssl_min_version",
    "ssl_ciphers",
    "ssl_include_verify_flags",
    "ssl_exclude_verify_flags",
    "ssl_validate_ocsp",
    "ssl_validate_ocsp_stapled",
    "ssl_ocsp_context",
    "ssl_ocsp_expected_cert",
)


def _tls_settings(kwargs: dict[str, Any], connection_class: Any) -> dict[str, str]:
    """The `ssl_...` URL options that carry a redis-py SSLConnection's CA, client certificate
    and checks over (empty when everything is at the secure default)."""
    for name in _UNSUPPORTED_TLS:
        if kwargs.get(name):
            hint = (
                "; give the CA as ssl_ca_certs and the client key unencrypted (PEM files)"
                if name in ("ssl_ca_path", "ssl_ca_data", "ssl_password")
                else " (leave it at redis-py's default)"
            )
            raise ValueError(
                f"client: the redis-py client's {name} is not supported by redmutex{hint}"
            )
    query: dict[str, str] = {}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        value = kwargs.get(name)
        if value:
            query[name] = os.fspath(value)
    reqs = kwargs.get("ssl_cert_reqs", "required")
    if reqs is None or reqs == ssl.CERT_NONE or str(reqs).lower() == "none":
        query["ssl_cert_reqs"] = "none"
    else:
        # redis-py's own default when the client was made without the argument.
        default = True
        try:
            parameter = inspect.signature(connection_class).parameters.get("ssl_check_hostname")
            if parameter is not None and isinstance(parameter.default, bool):
                default = parameter.default
        except (TypeError, ValueError):
            pass
        if not kwargs.get("ssl_check_hostname", default):
            query["ssl_check_hostname"] = "false"
    return query


def _tls_side(kwargs: dict[str, Any], connection_class: Any) -> dict[str, str] | None:
    """The TLS settings of one redis-py connection pool, or None for a plain-text one."""
    return _tls_settings(kwargs, connection_class) if _is_tls(connection_class) else None


def _tls_query(kwargs: dict[str, Any], connection_class: Any) -> str:
    query = _tls_settings(kwargs, connection_class)
    return f"?{_query(query)}" if query else ""


def _text(value: Any, what: str) -> str | None:
    """A credential as text: redis-py sends bytes as they are, so they are read as UTF-8 here
    (str() would make b"pw" the password "b'pw'")."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            pass
        # Raised outside the handler: the codec's error (chained) quotes the secret's bytes.
        raise ValueError(f"client: the redis-py client's {what} is not UTF-8")
    return None if value is None else str(value)


def _credentials(kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    """(username, password) of a redis-py pool's settings, as text."""
    username, password = _raw_credentials(kwargs)
    return _text(username, "username"), _text(password, "password")


def _raw_credentials(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(username, password) of a redis-py pool's settings: its own, or what its
    `credential_provider` gives now (redis-py asks it on every new connection; redmutex's
    connections take the credentials once, when the Client is made)."""
    provider = kwargs.get("credential_provider")
    if provider is None:
        return kwargs.get("username"), kwargs.get("password")
    get = getattr(provider, "get_credentials", None)
    if not callable(get):
        raise TypeError("client: its credential_provider has no get_credentials()")
    credentials = get()
    if not isinstance(credentials, tuple) or len(credentials) not in (1, 2):
        raise ValueError(
            "client: credential_provider.get_credentials() must return (password,) or"
            " (username, password)"
        )
    if len(credentials) == 1:
        return None, credentials[0]
    return credentials[0], credentials[1]


def url_of_redis_py(redis_client: Any) -> tuple[str, float | None, float | None]:
    """The URL (and timeouts, if set) of a redis-py client's connection pool."""
    pool = getattr(redis_client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        raise TypeError("client: expected a redmutex.Client, a URL string or a redis.Redis")
    db = int(kwargs.get("db") or 0)
    username, password = _credentials(kwargs)
    path = kwargs.get("path")
    sentinel = _sentinel_url(pool, kwargs, username, password)
    if sentinel is not None:
        url = sentinel
    elif path:
        query = {"db": str(db)}
        if username:
            query["user"] = username
        if password:  # as over TCP: an empty password is none (redis-py sends no AUTH for it)
            query["pass"] = str(password)
        url = f"unix://{quote(path)}?{_query(query)}"
    else:
        connection_class = getattr(pool, "connection_class", None)
        tls = _is_tls(connection_class)
        scheme = "rediss" if tls else "redis"
        host = kwargs.get("host") or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        port = int(kwargs.get("port") or 6379)
        url = f"{scheme}://{_userinfo(username, password)}{host}:{port}/{db}"
        if tls:
            url += _tls_query(kwargs, connection_class)
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
    options: dict[str, Any] = {"prefix": prefix}
    cluster = cluster_urls_of_redis_py(redis_client)
    if cluster is not None:
        client = Client(cluster=cluster, **options)
    else:
        url, connect_timeout, command_timeout = url_of_redis_py(redis_client)
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
    if hasattr(obj, "connection_pool") or hasattr(obj, "nodes_manager"):
        return from_redis(obj)
    raise TypeError(
        f"client: expected a redmutex.Client, a URL string or a redis.Redis, "
        f"not {type(obj).__name__}"
    )
