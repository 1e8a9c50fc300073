"""The stampede-safe cache: ``get_or_fill`` and ``@cached`` (check, lock, re-check, fill).

Division of labour: the Rust core (``_core.CacheStore``/``_core.FillClaim``) does the atomic Redis
steps and the waiting; this module serializes and signs values (``_codec``), decides early
refreshes (``_xfetch``), runs ``fill`` and builds the decorator.

Keys
----
The entry named N lives in ``prefix{N}:value`` (the payload, expiring after ``ttl``) and, while
somebody fills it, ``prefix{N}:fill`` (the filler's token, expiring after ``lock_ttl``); wake-ups
go out on the channel ``prefix{N}:wake``. ``@cached(key="user:{user_id}")`` fills N from the call's
arguments, a key without placeholders is N itself (shared with ``get_or_fill(client, N, ...)``),
and ``key=None`` derives N from the function's module, qualified name and arguments (see
``_callkeys``: ``mymod.fetch(url='http://x', retries=3)``, the same in every process; arguments
without a process-independent encoding raise ``TypeError``).

One call
--------
Its decisions are written once, without I/O: ``_decide`` reads a lookup's reply and ``_flow``
(a generator) asks for each further Redis step; ``_get`` here performs them with blocking calls,
``redmutex._aio_cache._get`` with awaited ones.

1. ``fetch`` runs one script, from the calling thread on a connection of its own (the hot path:
   one round trip, GIL released): the value is there → HIT (payload and the ms it has left);
   else the fill claim is free → the caller takes it (CLAIMED); else somebody fills → the caller
   waits, without polling, for the wake-up published when the value is stored or the claim given
   back, or for the claim's lease to end (its holder died), then runs the script again. Inside
   one process only one waiter per key looks in Redis, and hands what it read to all the others
   at once; a fill of the same process hands them its value without a look at all.
2. HIT: the payload is decoded (and its HMAC checked, with ``secret``) and returned. A payload
   that does not decode is a miss: a WARNING on the ``redmutex`` logger, then step 1 again with the
   payload's SHA-1, so that the script treats exactly that payload as absent (never as a value).
3. CLAIMED: ``fill()`` runs while a task of the Rust runtime extends the claim every
   ``lock_ttl``/3, so a fill may outlast ``lock_ttl``; a process that dies stops renewing, and its
   claim ends at most ``lock_ttl`` later, when one waiter takes over. The value is stored with the
   fill's duration δ, the claim is dropped and the waiters are woken, in one script. The filler's
   caller gets the value as it round-trips through the serializer (``loads`` of the bytes just
   dumped), exactly as every later caller does: with JSON a tuple comes back as a list. If ``fill``
   raises, the claim is given back (waking the waiters, of which exactly one claims the fill
   anew) and the exception propagates to this caller only. A store is token-checked: when the
   claim ended meanwhile (the entry was invalidated, or the process stalled beyond the lease),
   the value is returned to this caller but not stored: an INFO line after an invalidation (or
   a Redis restart or failover that lost the claim), a WARNING when the lease had run out
   (another caller may then have filled too; a ``lock_ttl`` of a few ms is too short for its
   renewal to reach Redis in time). A store that fails (Redis unreachable, full at ``maxmemory``,
   or refusing a value above its ``proto-max-bulk-len``) also returns the value to this caller,
   with a WARNING; the claim is given back and the waiters take the fill over, one at a time
   (while Redis is full or unreachable their claim fails too: they raise). A ``fill`` that asks (in its own
   thread) for the entry it is filling raises ``RuntimeError`` instead of waiting for itself.
4. ``timeout``: a caller that waited that long for another caller's fill raises
   ``LockTimeoutError`` (``None``: wait as long as fills go on; ``0``: never wait).

XFetch (``beta`` > 0)
---------------------
On a HIT with ``pttl`` ms left and a fill duration δ, the caller refreshes early when
``now - δ·beta·ln(rand()) ≥ expiry``, i.e. with probability ``exp(-pttl / (δ·beta))``
(``_xfetch.should_refresh`` with ``now = 0``, ``expiry = pttl``: Redis's clock, not ours). It then
tries to claim the fill without waiting, and only if the value it read is still the stored one:
the winner refills and returns the new value, everybody else returns the value they read. So
each stored value is refreshed at most once, and readers never wait while it is refreshed.
If the early refill raises an ``Exception`` (or its value does not serialize), or Redis refuses
its claim (a ``LockError``: Redis full at ``maxmemory``, unreachable), the winner too returns
the value it read, which is still valid: the claim is given back at once and the
failure logged as a WARNING (with the exception), so a later reader's refresh tries again; only
a fill on a miss hands its exception to the caller (as dogpile.cache surfaces errors only once
the value is gone). A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``, ``asyncio.CancelledError``) still propagates, the claim given
back.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import random
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast, overload

from . import _core
from ._callkeys import compile_key
from ._codec import Codec, PayloadError, Serializer, make_codec
from ._xfetch import should_refresh, validate_beta
from .errors import LockError, LockTimeoutError

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._types import ClientLike

__all__ = ["BoundCachedFunction", "CachedFunction", "cached", "get_or_fill"]

P = ParamSpec("P")
T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)

_log = logging.getLogger("redmutex")
_random = random.random  # the XFetch draw; module-level so tests can seed or replace it


class CachedFunction(Protocol[P, R_co]):
    """What ``@cached`` returns: the function, plus ``invalidate`` with the same parameters."""

    __name__: str
    __qualname__: str

    @property
    def __wrapped__(self) -> Callable[P, R_co]: ...

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """Drops the cached value of that call (and any fill of it in progress); True when a
        value was dropped."""
        ...

    @overload
    def __get__(self, instance: None, owner: Any, /) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: Any, /) -> BoundCachedFunction[R_co]: ...


class BoundCachedFunction(Protocol[R_co]):
    """A ``@cached`` method looked up on an instance (or a class, for a classmethod): calls and
    ``invalidate`` get the instance as their first argument, like a bound method."""

    __name__: str
    __qualname__: str

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...

    def invalidate(self, *args: Any, **kwargs: Any) -> bool: ...


def _unwrap_method(func: Any) -> tuple[Callable[..., Any], str | None]:
    """A classmethod or staticmethod under the decorator: its function and how it binds."""
    if isinstance(func, classmethod):
        return func.__func__, "class"
    if isinstance(func, staticmethod):
        return func.__func__, "static"
    return func, None


class _Bound:
    """What a ``@cached`` method is when looked up on an instance: its calls and ``invalidate``
    get the instance first (``Repo(1).load.invalidate(5)``). Other attributes (``__name__``,
    ``__wrapped__``, ...) are the decorated function's."""

    __slots__ = ("__func__", "__self__")

    def __init__(self, func: Any, instance: object) -> None:
        self.__func__ = func
        self.__self__ = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__.invalidate(self.__self__, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("__func__", "__self__"):  # unset slots (a half-made copy): no recursion
            raise AttributeError(name)
        return getattr(self.__func__, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # As a bound method pickles (``obj.load`` to a ProcessPoolExecutor): looked up again on
        # its instance or class, by name.
        return getattr, (self.__self__, self.__func__.__name__)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Bound)
            and other.__func__ is self.__func__
            and other.__self__ is self.__self__
        )

    def __hash__(self) -> int:
        return hash((id(self.__func__), id(self.__self__)))

    def __repr__(self) -> str:
        return f"<bound cached {self.__func__.__qualname__} of {self.__self__!r}>"


class _Descriptor:
    """What ``@cached`` and ``@aio.cached`` functions share: their settings and key, and their
    binding: looked up on an instance one binds like a method; a classmethod binds to the
    class, a staticmethod never binds. Pickled by reference."""

    __qualname__: str

    def __init__(
        self,
        func: Callable[..., Any],
        binding: str | None,
        settings: _Settings,
        key_of: Callable[[tuple[Any, ...], dict[str, Any]], str],
    ) -> None:
        functools.update_wrapper(cast(Any, self), func)
        self._binding = binding
        self._settings = settings
        self._key_of = key_of
        # A key without placeholders names one entry for every call: no binding needed.
        self._constant = key_of((), {}) if getattr(key_of, "is_constant", False) else None

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """The entry's name and the fill of one call."""
        func = self.__wrapped__  # type: ignore[attr-defined]
        name = self._constant if self._constant is not None else self._key_of(args, kwargs)
        return name, functools.partial(func, *args, **kwargs) if args or kwargs else func

    def __get__(self, instance: object, owner: Any = None) -> Any:
        if self._binding == "static":
            return self
        if self._binding == "class":
            return _Bound(self, owner if owner is not None else type(instance))
        if instance is None:
            return self
        return _Bound(self, instance)

    def __reduce__(self) -> str:
        return self.__qualname__


class _Cached(_Descriptor):
    """A ``@cached`` function (see ``cached``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _get(self._settings, *self._entry(args, kwargs))

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        return bool(self._settings.store.invalidate(self._key_of(args, kwargs)))

    def __repr__(self) -> str:
        return f"<cached {self.__qualname__}>"


class _Settings:
    """The validated options of one ``get_or_fill`` call or one ``@cached`` function."""

    __slots__ = ("beta", "codec", "space", "store", "timeout")

    def __init__(
        self,
        client: Any,
        ttl: float,
        lock_ttl: float,
        timeout: float | None,
        serializer: str | Serializer,
        secret: bytes | None,
        beta: float,
    ) -> None:
        self.store = _core.CacheStore(client, ttl=ttl, lock_ttl=lock_ttl, timeout=timeout)
        self.codec: Codec = make_codec(serializer, secret)
        self.beta = validate_beta(beta)
        self.timeout = self.store.timeout  # validated: None (forever) or seconds
        # Where its keys live (the server(s), redacted, and the prefix): a fill that asks for its
        # own entry through another client of the same URL is caught as through the same (and
        # through a URL spelled otherwise by asking Redis: see `_own_fill_suspects`).
        client = self.store.client
        self.space = (client.url, client.prefix)


# -- the flow of one cache read, written once (sans-I/O) ------------------------------------------
#
# ``_flow`` is a generator: it decides, and yields a request for each Redis step (or for running
# ``fill``); a driver performs the request and sends its result back (an exception of the step
# is thrown in). ``_get`` here drives it with blocking calls, ``redmutex._aio_cache._get`` with
# awaited ones; nothing else differs between the two.


@dataclass(slots=True)
class _Refetch:
    """Look ``key`` up again, treating the payload with SHA-1 ``skip`` as absent, waiting at
    most ``timeout`` s (None: as long as fills go on). Reply: the lookup's (see ``_read``)."""

    skip: str
    timeout: float | None


@dataclass(slots=True)
class _TryClaim:
    """Claim the fill without waiting, only if the payload with SHA-1 ``seen`` is still the
    stored one. Reply: the lookup's (see ``_read``)."""

    seen: str


@dataclass(slots=True)
class _Store:
    """Store ``payload`` under ``claim``, ending it and waking the waiters. Reply: stored?"""

    claim: _core.FillClaim
    payload: bytes


@dataclass(slots=True)
class _GiveBack:
    """Abandon ``claim`` after ``error`` ended the fill (a driver may leave it to run on in the
    background when the error is a cancellation). Reply: ignored."""

    claim: _core.FillClaim
    error: BaseException


class _Thrown(BaseException):
    """Carries a ``GeneratorExit`` into a flow. Thrown as itself it would close the flow
    (``yield from`` closes the delegate, whose give-back then cannot yield: "generator ignored
    GeneratorExit", the claim kept); ``_fill`` unwraps it, and so does ``_Driven.fail``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _unwrap(error: BaseException) -> BaseException:
    return error.error if isinstance(error, _Thrown) else error


@dataclass(slots=True)
class _Raise:
    """The flow's result when the caller must get an exception: a generator cannot raise a
    ``StopIteration`` that ``fill`` raised, so the driver raises it."""

    error: BaseException


@dataclass(slots=True)
class _RunFill:
    """Run ``fill``, holding the claim with ``token``. Reply: its value (awaited if need be)."""

    token: str


_Request = _RunFill | _Refetch | _TryClaim | _Store | _GiveBack
Flow = Generator[_Request, Any, Any]


class _Driven:
    """A flow under way: ``request`` is the step it waits for, until ``done``. A driver
    performs the step and hands back its reply (``send``) or its exception (``fail``)."""

    __slots__ = ("_flow", "_result", "done", "request")

    def __init__(self, flow: Flow) -> None:
        self._flow = flow
        self.done = False
        self.request: _Request = _RunFill("")
        self._result: Any = None
        self.send(None)

    def send(self, reply: Any) -> None:
        try:
            self.request = self._flow.send(reply)
        except StopIteration as stop:
            self.done, self._result = True, stop.value

    def fail(self, error: BaseException) -> None:
        thrown = _Thrown(error) if isinstance(error, GeneratorExit) else error
        try:
            self.request = self._flow.throw(thrown)
        except StopIteration as stop:
            self.done, self._result = True, stop.value
        except _Thrown as passed:  # a step the flow does not handle: the driver's to raise
            self.done, self._result = True, _Raise(passed.error)

    def result(self) -> Any:
        """The flow's value (raising what it says to raise)."""
        if isinstance(self._result, _Raise):
            raise self._result.error
        return self._result


def _read(reply: Any) -> _core.CacheHit | _core.FillClaim | None:
    """What a lookup found: a stored value, the fill claim (held by this caller), or None (another
    caller fills and the wait ended first); the one place that reads a lookup's reply."""
    found: _core.CacheHit | _core.FillClaim | None = reply
    return found


# What a lookup's reply means (``_decide``): serve the value; fill (holding the claim); refresh
# the value read, XFetch having chosen this caller; look again, the payload being unusable.
_SERVE = "serve"
_FILL = "fill"
_REFRESH = "refresh"
_UNUSABLE = "unusable"

Decision = tuple[str, Any, str | None]


def _decide(settings: _Settings, key: str, reply: Any) -> Decision:
    """What a lookup's reply means: ``(_SERVE, value, None)``, ``(_FILL, claim, None)``,
    ``(_REFRESH, value, digest)`` or ``(_UNUSABLE, PayloadError, digest)``; raises
    ``LockTimeoutError`` when another caller's fill outlasted the wait."""
    found = _read(reply)
    if isinstance(found, _core.FillClaim):
        return _FILL, found, None
    if found is None:
        raise _timeout_error(settings, key)
    payload, pttl = found.payload, found.pttl_ms
    try:
        value, delta = settings.codec.decode(payload, context=key)
    except PayloadError as exc:
        return _UNUSABLE, exc, _digest(payload)
    # XFetch, on Redis's clock: the value expires ``pttl`` ms from now (-1: never).
    beta = settings.beta
    if beta > 0 and pttl >= 0 and should_refresh(0.0, pttl / 1000.0, delta, beta, _random):
        return _REFRESH, value, _digest(payload)
    return _SERVE, value, None


def _flow(settings: _Settings, key: str, decision: Decision) -> Flow:
    """The rest of one cache read (see the module docstring) after its first lookup, whose
    ``_decide`` is ``decision`` (a driver serves a plain hit itself); returns the value, or
    ``_Raise``."""
    deadline: float | None = None
    while True:
        what, found, digest = decision
        if what is _FILL:
            return (yield from _fill(settings, key, found))
        if what is _REFRESH and digest is not None:
            # Refill if nobody does yet and the value is still the one read; else the value
            # read is the answer. So it is when Redis refuses the claim (full at maxmemory, a
            # blip): the refresh is the reader's extra, never a reason to fail the read.
            try:
                claim = _read((yield _TryClaim(digest)))
            except LockError as exc:
                _log.warning(
                    "cache entry %r: the early refresh could not claim the fill; serving the "
                    "current value: %s",
                    key,
                    exc,
                )
                return found
            if isinstance(claim, _core.FillClaim):
                return (yield from _fill(settings, key, claim, refreshing=found))
            return found
        if what is not _UNUSABLE or digest is None:
            return found
        # A miss: logged, then looked up again with exactly that payload counting as absent,
        # until a usable value, a claim, or the timeout.
        _log.warning("cache entry %r: ignoring the stored payload (%s); filling anew", key, found)
        now = time.monotonic()
        if deadline is None and settings.timeout is not None:
            deadline = now + settings.timeout
        timeout = None if deadline is None else max(deadline - now, 0.0)
        decision = _decide(settings, key, (yield _Refetch(digest, timeout)))


_NOTHING: Any = object()  # ``_fill``'s ``refreshing`` on a miss: no value to fall back on


def _fill(
    settings: _Settings, key: str, claim: _core.FillClaim, refreshing: Any = _NOTHING
) -> Flow:
    """Runs ``fill`` holding the claim, stores its value (with δ) and wakes the waiters.
    ``refreshing``: the still valid value an early (XFetch) refresh replaces, returned instead
    of a failure of the fill."""
    started = time.monotonic()
    try:
        value = yield _RunFill(claim.token)
        delta = time.monotonic() - started
        # What the filler's caller gets is what every later caller gets: the value as it
        # round-trips through the serializer (loads of the bytes just dumped).
        payload, value = settings.codec.encode_round_trip(value, delta, context=key)
    except BaseException as thrown:  # noqa: BLE001 - handed to the caller, after the give-back
        exc = _unwrap(thrown)
        # Given back (never masking the fill's own exception): one waiter takes the fill over.
        try:
            yield _GiveBack(claim, exc)
        except LockError as failure:
            _log.warning(
                "cache entry %r: could not give the fill claim back (it is sent again in the "
                "background until Redis answers or the claim's lease ends): %s",
                key,
                failure,
            )
        if refreshing is not _NOTHING and isinstance(exc, Exception):
            # The value read is still valid: its reader gets it, like every other reader, and
            # a later refresh (early or at expiry) tries again. Interrupts still propagate.
            _log.warning(
                "cache entry %r: the early refresh failed; serving the current value",
                key,
                exc_info=exc,
            )
            return refreshing
        return _Raise(exc)
    try:
        stored = yield _Store(claim, payload)
    except LockError as exc:  # Redis trouble: this caller still has its value
        _log.warning("cache entry %r: the filled value could not be stored: %s", key, exc)
        return value
    if not stored and claim.lapsed:
        # The lease ran out while the fill ran: another caller may have claimed and filled too.
        _log.warning(
            "cache entry %r: the filled value was not stored: the fill outlived its claim's "
            "lease of %g s (renewed every third of it), so another caller may have filled it "
            "too; raise lock_ttl well above Redis's round trip",
            key,
            settings.store.lock_ttl,
        )
    elif not stored:
        _log.info(
            "cache entry %r: the filled value was not stored: the entry was invalidated "
            "while it was filled (or Redis lost the claim: a restart or a failover)",
            key,
        )
    return value


# -- the blocking driver ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Filling:
    """A fill under way: where its entry lives (``_Settings.space``), its key, its claim's token."""

    space: tuple[str, str]
    key: str
    token: str


def _own_entry_error(key: str) -> RuntimeError:
    return RuntimeError(
        f"cache entry {key!r} was asked for from its own fill, which would wait for itself"
    )


def _own_fill_suspects(fills: Iterable[_Filling], settings: _Settings, key: str) -> list[str]:
    """The claim tokens of those of ``fills`` that may be the entry ``key`` of ``settings``: the
    same key and prefix through a client whose URL is spelled otherwise (``/0``, ``localhost``, a
    redis.Redis...), which only Redis can tell. Raises ``RuntimeError`` for one surely the same
    (the same URL and prefix)."""
    suspects = []
    for fill in fills:
        if fill.key != key or fill.space[1] != settings.space[1]:
            continue
        if fill.space == settings.space:
            raise _own_entry_error(key)
        suspects.append(fill.token)
    return suspects


# The fills each caller (a thread; under gevent's patching, a greenlet: `_core._caller`) is
# running right now: a fill that asks for its own entry would wait for itself (its claim is
# renewed while it runs), so it raises instead. A caller's entry lives while it fills.
_filling: dict[int, list[_Filling]] = {}


def _refuse_own_entry(settings: _Settings, key: str, fills: list[_Filling]) -> None:
    for token in _own_fill_suspects(fills, settings, key):
        if settings.store.holds_claim(key, token):
            raise _own_entry_error(key)


def _digest(payload: bytes) -> str:
    """How a payload is named to the scripts (compared with Redis's ``redis.sha1hex``)."""
    return hashlib.sha1(payload, usedforsecurity=False).hexdigest()


def _timeout_error(settings: _Settings, key: str) -> LockTimeoutError:
    return LockTimeoutError(
        f"cache entry {key!r}: another caller's fill did not finish within {settings.timeout} s",
        name=key,
    )


def _run_fill(settings: _Settings, key: str, fill: Callable[[], T], token: str) -> T:
    caller = _core._caller()
    fills = _filling.setdefault(caller, [])
    mine = _Filling(settings.space, key, token)
    fills.append(mine)
    try:
        value = fill()
        if inspect.isawaitable(value):
            # An async fill given to the blocking helper (a lambda around a coroutine function,
            # say): refused like a fill that raised, its claim given back.
            close = getattr(value, "close", None)
            if close is not None:
                close()
            raise TypeError(f"fill for {key!r} returned an awaitable; use redmutex.aio.get_or_fill")
        return value
    finally:
        fills.remove(mine)
        if not fills:
            del _filling[caller]


def _get(settings: _Settings, key: str, fill: Callable[[], T]) -> T:
    """One cache read: ``_flow`` with blocking Redis steps."""
    fills = _filling.get(_core._caller()) if _filling else None
    if fills:  # inside a fill: refuse to wait for ourselves
        _refuse_own_entry(settings, key, fills)
    store = settings.store
    decision = _decide(settings, key, store.fetch(key))
    if decision[0] is _SERVE:  # the hit path: no flow needed
        served: T = decision[1]
        return served
    flow = _Driven(_flow(settings, key, decision))
    reply: Any = None
    while not flow.done:
        request = flow.request
        try:
            if isinstance(request, _RunFill):
                reply = _run_fill(settings, key, fill, request.token)
            elif isinstance(request, _Store):
                reply = request.claim.store(request.payload)
            elif isinstance(request, _Refetch):
                reply = store.fetch(key, request.skip, timeout=request.timeout)
            elif isinstance(request, _TryClaim):
                reply = store.try_claim(key, request.seen)
            elif isinstance(request, _GiveBack):
                reply = request.claim.abandon()
        except BaseException as exc:  # noqa: BLE001 - the flow decides what each failure means
            flow.fail(exc)
        else:
            flow.send(reply)
    value: T = flow.result()
    return value


def get_or_fill(
    client: ClientLike,
    key: str,
    fill: Callable[[], T],
    *,
    ttl: float,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> T:
    """The cached value of ``key``; on a miss exactly one caller runs ``fill`` and stores it.

    Of any number of concurrent callers (threads or processes) that miss ``key``, one runs
    ``fill``; the others wait without polling and return the value it stored. If ``fill`` raises,
    its caller gets the exception and one waiting caller takes over the fill. ``None`` is cached
    like any value. Every caller, the filler's included, gets the value as it round-trips
    through the serializer. ``ttl``: how long the value lives; ``lock_ttl``: the lease of the fill claim
    (renewed while the fill runs, so it bounds how long a dead filler holds the others up);
    ``timeout``: how long to wait for another caller's fill before ``LockTimeoutError``.
    ``beta`` > 0 refreshes early (XFetch), ``0`` never. ``serializer``: ``"pickle"``, ``"json"``
    or an object with ``dumps``/``loads``; with ``secret`` payloads are HMAC-SHA256 signed and a
    payload that fails the check is a miss, logged on the ``redmutex`` logger.
    """
    if not callable(fill):
        raise TypeError(f"fill: expected a callable, not {type(fill).__name__}")
    if inspect.iscoroutinefunction(fill):
        raise TypeError(
            f"fill: {getattr(fill, '__qualname__', fill)!r} is an async function; "
            "use redmutex.aio.get_or_fill"
        )
    settings = _Settings(client, ttl, lock_ttl, timeout, serializer, secret, beta)
    return _get(settings, key, fill)


def cached(
    client: ClientLike,
    *,
    ttl: float,
    key: str | Callable[..., str] | None = None,
    lock_ttl: float = 10.0,
    timeout: float | None = None,
    serializer: str | Serializer = "pickle",
    secret: bytes | None = None,
    beta: float = 1.0,
) -> Callable[[Callable[P, T]], CachedFunction[P, T]]:
    """Decorator: ``get_or_fill`` for every call of the function, with the same options
    (checked here, at decoration time).

    ``key`` names each call's entry:

    * a template such as ``"user:{user_id}"``: ``{param}`` is filled with ``str()`` of the call's
      argument (bound to the signature, defaults applied; ``{param.attr}``, ``{param[key]}`` and
      format specs work as in ``str.format``); checked against the signature when decorating;
      a value whose ``str()`` is its address (``<mod.User object at 0x...>``: its class defines
      neither ``__str__`` nor ``__repr__``) raises ``TypeError``, as it would name another entry
      for every object and process (and a set of strings prints its members in another order in
      each process: pass a sorted tuple);
    * a string without placeholders: that one entry for every call, shared with
      ``get_or_fill(client, key, ...)``;
    * a callable: called with the call's own arguments (a method's ``self`` included), it
      returns the key string: ``key=lambda self, x: f"repo:{self.id}:{x}"``;
    * ``None``: derived from the function's module, qualified name and arguments, e.g.
      ``mymod.fetch(url='http://x', retries=3)`` — the same in every process and Python
      version (never ``hash()``, ``id()`` or ``repr()`` of arbitrary objects). Positional,
      keyword and defaulted spellings of a call give one key. Arguments must be ``None``,
      bool, int, float, str, bytes, enum members, or tuples, lists, dicts, sets and frozensets
      of those; anything else (an object, a ``self``) raises ``TypeError`` naming the argument:
      pass ``key="..."`` then. On a method, ``self``/``cls`` is left out of the key (as
      dogpile.cache does: the first parameter of a function defined in a class body, when it is
      named ``self`` or ``cls``), so all instances share one entry per argument list; use a
      template or a key function for a key per instance. The key names the function, not what
      it closes over: a lambda is refused (``TypeError``), and the functions a factory makes
      share entries, so give those ``key=``. Keys over 200 characters are shortened
      with a SHA-256 digest. (The full rules: ``redmutex._callkeys``.)

    ``fetch.invalidate(*args, **kwargs)`` drops the cached value of that call (and any fill of
    it in progress, whose value is then not stored); it returns True when a value was dropped.
    The decorated function binds like a method: ``Repo(1).load(5)`` and
    ``Repo(1).load.invalidate(5)`` pass the instance first. ``@cached`` may also be put above
    ``@classmethod`` or ``@staticmethod``.
    """
    settings = _Settings(client, ttl, lock_ttl, timeout, serializer, secret, beta)

    decorate: Callable[[Callable[P, T]], CachedFunction[P, T]]
    decorate = _decorator(settings, key, _Cached, "@cached")
    return decorate


def _decorator(
    settings: _Settings, key: str | Callable[..., str] | None, kind: type[_Descriptor], label: str
) -> Any:
    """What ``cached`` and ``aio.cached`` share: ``kind`` (``_Cached`` or the asyncio one)
    around each function, with its key compiled against the function's signature."""

    def decorate(func: Any) -> Any:
        plain, binding = _unwrap_method(func)
        if not callable(plain):
            raise TypeError(f"{label}: expected a function, not {type(func).__name__}")
        if kind is _Cached and inspect.iscoroutinefunction(plain):
            raise TypeError(
                f"@cached: {getattr(plain, '__qualname__', plain)!r} is an async function; "
                "use redmutex.aio.cached"
            )
        if inspect.isgeneratorfunction(plain) or inspect.isasyncgenfunction(plain):
            # Its value would be a generator, which no serializer stores: every call would
            # claim, run, fail and give the claim back.
            raise TypeError(
                f"{label}: {getattr(plain, '__qualname__', plain)!r} is a generator function; "
                "cache a function that returns the values (e.g. a list)"
            )
        receiver = None if binding is None else binding == "class"
        return kind(plain, binding, settings, compile_key(key, plain, receiver))

    return decorate
