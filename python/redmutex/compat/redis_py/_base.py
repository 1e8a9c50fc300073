"""What the sync and the asyncio shim of redis-py's Lock share: the constructor, the lease an
acquire asks for, the wait it allows, its token, and the token and hold kept per thread (per
task in asyncio)."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace
from typing import Any, ClassVar

from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from redis.lock import Lock as _RedisPyLock

from ..._core import _CompatHold, _CompatLock
from .._common import (
    NO_EXPIRY_LEASE,
    client_of,
    encode,
    keep_renewing,
    key_name,
    server_of,
    stop_renewing,
    token_text,
)

Number = int | float


# The largest |ms| an extend sends: the script adds what is left of the lease in Lua (a double),
# exact to 2**53; Redis itself refuses an expiry past 2**63 ms.
_EXTEND_MS_LIMIT = 2**53


def extend_ms(additional_time: Number) -> int:
    """``extend``'s seconds as the ms its script takes, as redis-py computes them. A value
    past what Redis takes is redis-py's ResponseError, as Redis answers it there (the binding
    would raise OverflowError, or Lua's double lose the sum)."""
    ms = int(additional_time * 1000)
    if not -_EXTEND_MS_LIMIT <= ms <= _EXTEND_MS_LIMIT:
        raise ResponseError(f"extend: {additional_time!r} s is out of range for Redis")
    return ms


# The largest PX Redis' SET takes (a long long; Redis also adds the time now to it).
_SET_PX_LIMIT = 2**63 - 1


def lease_ms(timeout: Number) -> int:
    """``timeout`` as the PX that redis-py's ``do_acquire`` sends (``int(timeout * 1000)``), and
    Redis' answer to one it refuses as redis-py raises it: a ResponseError at acquire (a
    negative or sub-millisecond ``timeout``, which redis-py sends as PX <= 0)."""
    ms = int(timeout * 1000)
    if ms <= 0:
        raise ResponseError("invalid expire time in 'set' command")
    if ms > _SET_PX_LIMIT:
        raise ResponseError("value is not an integer or out of range")
    return ms


class LockBase:
    """redis-py's Lock attributes and the bookkeeping of a hold; the sync and asyncio classes
    add the calls."""

    #: What keeps the token and hold per thread (per task) when ``thread_local``
    #: (see `_new_local`).
    _local_class: ClassVar[type[Any]]

    # redis-py's scripts and their registered objects, for code that reads or runs them itself
    # (the shim's own calls run redmutex's owner-checked scripts, which write the same keys).
    LUA_RELEASE_SCRIPT: ClassVar[str] = _RedisPyLock.LUA_RELEASE_SCRIPT
    LUA_EXTEND_SCRIPT: ClassVar[str] = _RedisPyLock.LUA_EXTEND_SCRIPT
    LUA_REACQUIRE_SCRIPT: ClassVar[str] = _RedisPyLock.LUA_REACQUIRE_SCRIPT
    lua_release: ClassVar[Any] = None
    lua_extend: ClassVar[Any] = None
    lua_reacquire: ClassVar[Any] = None

    def _new_local(self) -> Any:
        """A new per-thread (per-task) keeper of the token and hold: a `_local_class`."""
        return self._local_class()

    def __init__(
        self,
        redis: Any,
        name: str | bytes,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self.redis = redis
        self.name: Any = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = self._new_local() if self.thread_local else SimpleNamespace()
        self.local.token = None
        self._key = encode(redis, name)
        client = client_of(redis)
        self._server = server_of(client)
        self._core = _CompatLock(client, key_name(self._key), self._key)
        self.register_scripts()

    def register_scripts(self) -> None:
        """Registers redis-py's scripts on the client, once per class, as redis-py does (no
        round trip: a script is loaded when first run)."""
        cls = self.__class__
        register = getattr(self.redis, "register_script", None)
        if register is None:
            return
        if cls.lua_release is None:
            cls.lua_release = register(cls.LUA_RELEASE_SCRIPT)
        if cls.lua_extend is None:
            cls.lua_extend = register(cls.LUA_EXTEND_SCRIPT)
        if cls.lua_reacquire is None:
            cls.lua_reacquire = register(cls.LUA_REACQUIRE_SCRIPT)

    def _no_expiry(self) -> bool:
        """Whether redis-py keeps this lock's key without expiry: any falsy ``timeout`` (None,
        0), for which its ``do_acquire`` sends no PX."""
        return not self.timeout

    def _lease(self) -> tuple[float, bool]:
        """The lease of an acquire and whether it is renewed (redis-py: no timeout, no expiry)."""
        if self._no_expiry():
            return NO_EXPIRY_LEASE, True
        return lease_ms(self.timeout or 0) / 1000, False

    def _took(self, raw: bytes, hold: _CompatHold, renew: bool) -> None:
        """A hold `do_acquire` took: like redis-py's, it leaves ``local.token`` alone (the
        object does not hold it); a hold without expiry is kept renewing by the process's
        registry until a release with that token, as any such hold is."""
        where = self._where(raw)
        if where is None:
            return
        if renew:
            keep_renewing(where, hold, self._core)
        else:
            stop_renewing(where)  # a renewal of this token belongs to a hold released elsewhere

    def _no_expiry_error(self, what: str) -> LockError:
        """redis-py's answer to ``do_extend``/``do_reacquire`` on a lock without expiry: its
        extend script finds no TTL and answers "not owned"; its reacquire would send PEXPIRE 0
        (``timeout=0``), which deletes the lock: refused here as ``reacquire()`` refuses
        ``timeout=None``."""
        if what == "extend":
            return LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)

    def _wait(self, blocking: bool | None, blocking_timeout: Number | None) -> float | None:
        """How long an acquire waits (None: for good), from its arguments or the lock's."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if not blocking:
            return 0.0
        if blocking_timeout is None:
            return None
        return max(float(blocking_timeout), 0.0)

    def _blocks(self, blocking: bool | None) -> bool:
        """Whether an acquire waits when the lock is busy (its argument, or the lock's)."""
        return bool(self.blocking if blocking is None else blocking)

    def _token_of(self, token: str | bytes | None) -> tuple[bytes, bool]:
        """The token of an acquire as bytes, and whether the caller chose it."""
        if token is None:
            return uuid.uuid1().hex.encode(), False
        return encode(self.redis, token), True

    def _hold(self) -> _CompatHold | None:
        return getattr(self.local, "hold", None)

    def _token(self) -> bytes | None:
        """This thread's (task's) token; None in a forked child for the token of a hold its
        parent took: the child holds none of its parent's locks, so its copy of this object must
        not release or extend the parent's hold (redis-py's does). A token the child sets in
        ``local.token`` itself, or passes to ``do_release``, still works."""
        token: bytes | None = self.local.token
        taken = getattr(self.local, "taken", None)
        if taken is not None and taken[1] is token and taken[0] != os.getpid():
            return None
        return token

    def _held_token(self, token: bytes | str | None, what: str) -> str:
        """`token` as the engine takes it, or redis-py's LockError for a call on an unlocked
        lock (its `do_extend` and `do_reacquire` hooks called directly). A token set in
        ``local.token`` as text is encoded as redis-py's client sends it."""
        if token is None:
            raise LockError(f"Cannot {what} an unlocked lock", lock_name=self.name)
        return token_text(encode(self.redis, token))

    def _where(self, token: str | bytes) -> tuple[str, bytes, str] | None:
        """The registry's key of this lock's hold for `token` (see `_common.keep_renewing`);
        None for a token the shim never holds with (not UTF-8)."""
        try:
            return self._server, self._key, token_text(encode(self.redis, token))
        except ValueError:
            return None

    def _set(self, token: bytes | None, hold: _CompatHold | None, renew: bool = False) -> None:
        """Records the hold of this thread (task); a renewed one (no timeout) is also kept in
        the process's registry, so it outlives this object and its thread until released."""
        previous = self._hold()
        previous_token = self.local.token
        if previous is not None and previous is not hold:
            previous.stop()
            where = None if previous_token is None else self._where(previous_token)
            if where is not None:
                stop_renewing(where, only=previous)
        self.local.token = token
        self.local.hold = hold
        self.local.taken = None if token is None else (os.getpid(), token)
        where = None if hold is None or token is None else self._where(token)
        if where is not None and hold is not None:
            if renew:
                keep_renewing(where, hold, self._core)
            else:
                # The lock was free: a renewal this process still runs for the token belongs to
                # a hold released elsewhere, and must not keep this expiring one alive.
                stop_renewing(where)

    def _stop_renewal(self, token: bytes) -> None:
        """Stops the renewal of `token`'s hold on this lock, whichever object took it."""
        where = self._where(token)
        if where is not None:
            stop_renewing(where)

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (redmutex's addition), None when not held."""
        hold = self._hold()
        return None if hold is None or self._token() is None else hold.fence


def poll(sleep: Number) -> float:
    """How often a waiter looks again while a plain redis-py process holds the lock."""
    try:
        seconds = float(sleep)
    except (TypeError, ValueError):
        raise TypeError(
            f"sleep: expected a number of seconds, not {type(sleep).__name__}"
        ) from None
    if not seconds > 0:  # also NaN
        seconds = 0.001
    return min(seconds, 86400.0)


def poll_of(sleep: Number | None) -> tuple[float | None, TypeError | None]:
    """`poll(sleep)`, or the TypeError of a ``sleep`` that is no number (None, say). redis-py
    reads ``sleep`` only once an attempt failed and it is to wait, so such a ``sleep`` still
    takes a free lock: the caller makes one attempt then, and raises the error only where
    redis-py would (blocking, and the lock busy)."""
    try:
        return poll(sleep), None  # type: ignore[arg-type]
    except TypeError as error:
        return None, error
