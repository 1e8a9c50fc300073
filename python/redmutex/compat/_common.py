"""What the shims share: one redmutex Client per redis-py connection pool, key encoding, and the
process's registry of holds kept without expiry."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from .. import Client
from .._client import from_redis
from .._core import _CompatHold, _CompatLock

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


# -- holds "without expiry": renewed for as long as this process lives ------------------------
#
# The originals keep such a key until somebody releases it with the token, whatever becomes of
# the Lock object that took it (python-redis-lock's docs release from another Lock with the same
# id; redis-py releases by token). The renewal belongs to the hold, so the hold is kept here,
# not (only) by the shim object: dropping that object, or the end of the thread/task that held
# it (thread_local), leaves the renewal on. A release or reset of the key through any shim
# object stops and forgets it; a hold whose renewal found it lost is forgotten at the next use
# of the registry.

#: (server, lock key, token) -> (the renewing hold, the engine lock that keeps its client).
_Where = tuple[str, bytes, str]
_renewing: dict[_Where, tuple[_CompatHold, _CompatLock]] = {}
_renewing_lock = threading.Lock()
#: A forked child's copies of its parent's holds: the renewals are the parent's (they run on
#: the parent's runtime), so the child neither renews, stops nor drops them.
_inherited: list[dict[_Where, tuple[_CompatHold, _CompatLock]]] = []


def server_of(client: Client) -> str:
    """Which server a shim's lock is on, for the registry: the client's URL (its password
    redacted), shared by every redis-py client of that server, whatever its pool."""
    return client.url


def _sweep() -> list[_CompatHold]:
    """Forgets the holds whose renewal found them lost (caller holds `_renewing_lock`)."""
    gone = [where for where, (hold, _) in _renewing.items() if hold.lost]
    return [_renewing.pop(where)[0] for where in gone]


def keep_renewing(where: _Where, hold: _CompatHold, core: _CompatLock) -> None:
    """Keeps `hold` (taken without expiry) renewing until released through any shim object."""
    with _renewing_lock:
        dropped = _sweep()
        previous = _renewing.get(where)
        _renewing[where] = (hold, core)
    if previous is not None and previous[0] is not hold:
        dropped.append(previous[0])  # lost or released already: a new hold took its place
    for old in dropped:
        old.stop()


def stop_renewing(where: _Where, only: _CompatHold | None = None) -> None:
    """Stops and forgets the renewal of `where` (a release); `only`: if it is that hold."""
    with _renewing_lock:
        entry = _renewing.get(where)
        if entry is None or (only is not None and entry[0] is not only):
            return
        del _renewing[where]
    entry[0].stop()


def stop_renewing_key(server: str, key: bytes) -> None:
    """Stops and forgets every renewal of `key` on `server`, whatever its token (a reset)."""
    with _renewing_lock:
        gone = [w for w in _renewing if w[0] == server and w[1] == key]
        holds = [_renewing.pop(w)[0] for w in gone]
    for hold in holds:
        hold.stop()


def renews(where: _Where) -> bool:
    """Whether this process keeps a hold of `where` without expiry."""
    with _renewing_lock:
        entry = _renewing.get(where)
        return entry is not None and not entry[0].lost


def renewing() -> list[_Where]:
    """(server, lock key, token) of every hold this process keeps without expiry (and does not
    know to be lost)."""
    with _renewing_lock:
        _sweep()
        return list(_renewing)


def _forget_the_parents_holds() -> None:
    global _renewing_lock
    _renewing_lock = threading.Lock()  # another thread may have held it at the fork
    if _renewing:
        _inherited.append(dict(_renewing))
        _renewing.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parents_holds)
