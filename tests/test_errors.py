"""The exception hierarchy and argument validation (including property tests with hypothesis)."""

from __future__ import annotations

import builtins
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redmutex
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ------------------------------------------------------------------------------ hierarchy


def test_hierarchy() -> None:
    E = redmutex
    assert issubclass(E.LockError, Exception)
    assert E.LockException is E.LockError
    assert issubclass(E.LockTimeoutError, E.LockError)
    assert issubclass(E.LockTimeoutError, TimeoutError)
    assert issubclass(E.LockNotOwnedError, E.LockError)
    assert issubclass(E.LockLostError, E.LockError)
    assert issubclass(E.QuorumError, E.LockError)
    assert issubclass(E.ConnectionError, E.LockError)
    assert issubclass(E.ConnectionError, builtins.ConnectionError)
    assert E.ConnectionError is not builtins.ConnectionError
    # the siblings are distinct and unrelated
    siblings = [E.LockTimeoutError, E.LockNotOwnedError, E.LockLostError, E.QuorumError]
    siblings.append(E.ConnectionError)
    for a in siblings:
        for b in siblings:
            if a is not b:
                assert not issubclass(a, b), (a, b)
    for cls in (E.LockNotOwnedError, E.LockLostError, E.QuorumError):
        assert not issubclass(cls, TimeoutError)
        assert not issubclass(cls, builtins.ConnectionError)
    assert not issubclass(E.LockError, TimeoutError)
    assert not issubclass(E.LockError, builtins.ConnectionError)
    assert not issubclass(E.LockTimeoutError, builtins.ConnectionError)


def test_exceptions_are_constructible_with_message() -> None:
    for cls in (
        redmutex.LockError,
        redmutex.LockTimeoutError,
        redmutex.LockNotOwnedError,
        redmutex.LockLostError,
        redmutex.QuorumError,
        redmutex.ConnectionError,
    ):
        exc = cls("some message")
        assert str(exc) == "some message"
        with pytest.raises(redmutex.LockError):
            raise exc


def test_exported_names() -> None:
    for name in (
        "Client",
        "Lock",
        "locked",
        "acquire_lock",
        "release_lock",
        "redis_lock",
        "LockError",
        "LockException",
        "LockTimeoutError",
        "LockNotOwnedError",
        "LockLostError",
        "QuorumError",
        "ConnectionError",
    ):
        assert hasattr(redmutex, name), name
        assert name in redmutex.__all__, name


# ------------------------------------------------------------------------------ bad arguments


def _raises_naming(
    fn: Callable[[], object], argname: str, kinds: tuple[type[Exception], ...]
) -> BaseException:
    with pytest.raises(kinds) as excinfo:
        fn()
    assert argname in str(excinfo.value).lower(), (argname, str(excinfo.value))
    # OverflowError is an ArithmeticError, PanicException a BaseException: neither gets here
    assert not isinstance(excinfo.value, OverflowError)
    return excinfo.value


VE = (ValueError,)
VT = (ValueError, TypeError)

BAD_TTLS: list[tuple[object, tuple[type[Exception], ...]]] = [
    (0, VE),
    (0.0, VE),
    (-1, VE),
    (-0.5, VE),
    (0.0005, VE),
    (0.0009999, VE),
    (math.nan, VE),
    (math.inf, VE),
    (-math.inf, VE),
    (1e300, VE),
    (2**64, VE),
    (10**30, VE),
    (2**2000, VE),
    (-(2**2000), VE),
    ("10", VT),
    (b"10", VT),
    ([], VT),
    (object(), VT),
]


@pytest.mark.parametrize(("ttl", "kinds"), BAD_TTLS, ids=lambda v: repr(v)[:20])
def test_bad_ttl(client: redmutex.Client, ttl: Any, kinds: tuple[type[Exception], ...]) -> None:
    _raises_naming(lambda: redmutex.Lock(client, "x", ttl=ttl), "ttl", kinds)


@pytest.mark.parametrize(("ttl", "kinds"), BAD_TTLS, ids=lambda v: repr(v)[:20])
def test_bad_extend_ttl(
    client: redmutex.Client, ttl: Any, kinds: tuple[type[Exception], ...]
) -> None:
    lock = redmutex.Lock(client, "x", ttl=10)
    assert lock.acquire(timeout=5)
    try:
        _raises_naming(lambda: lock.extend(ttl), "ttl", kinds)
        assert lock.owned()  # a rejected argument leaves the hold alone
    finally:
        lock.release()


@pytest.mark.parametrize("ttl", [0.001, 0.5, 1, 10, 3600.0, 86400 * 30])
def test_good_ttl(client: redmutex.Client, ttl: float) -> None:
    lock = redmutex.Lock(client, "x", ttl=ttl)
    if ttl >= 0.5:
        assert lock.acquire(timeout=5)
        lock.extend(ttl)
        lock.release()


BAD_TIMEOUTS: list[tuple[object, tuple[type[Exception], ...]]] = [
    (-1, VE),
    (-0.001, VE),
    (-math.inf, VE),
    (math.nan, VE),
    (-(2**2000), VE),
    ("1", VT),
    (b"1", VT),
    ([1], VT),
    (object(), VT),
]


@pytest.mark.parametrize(("timeout", "kinds"), BAD_TIMEOUTS, ids=lambda v: repr(v)[:20])
def test_bad_constructor_timeout(
    client: redmutex.Client, timeout: Any, kinds: tuple[type[Exception], ...]
) -> None:
    _raises_naming(
        lambda: redmutex.Lock(client, "x", timeout=timeout),
        "timeout",
        kinds,
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("timeout", "kinds"), BAD_TIMEOUTS, ids=lambda v: repr(v)[:20])
def test_bad_acquire_timeout(
    client: redmutex.Client, timeout: Any, kinds: tuple[type[Exception], ...]
) -> None:
    lock = redmutex.Lock(client, "x", ttl=10)
    _raises_naming(lambda: lock.acquire(timeout=timeout), "timeout", kinds)
    assert lock.token is None
    assert not lock.locked()  # a rejected call did not take the lock


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", [2**2000, 10**400, 1e300, 2**64])
def test_huge_timeout_never_overflows(client: redmutex.Client, timeout: float) -> None:
    # "forever" in practice: either accepted, or rejected as a ValueError naming timeout
    try:
        lock = redmutex.Lock(client, "x", timeout=timeout)
    except ValueError as exc:
        assert "timeout" in str(exc).lower()
    else:
        assert lock.acquire() is True
        lock.release()
    lock = redmutex.Lock(client, "x")
    try:
        got = lock.acquire(timeout=timeout)
    except ValueError as exc:
        assert "timeout" in str(exc).lower()
    else:
        assert got is True
        lock.release()


@pytest.mark.parametrize(
    ("kwargs", "argname"),
    [
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"connect_timeout": math.nan}, "connect_timeout"),
        ({"connect_timeout": "5"}, "connect_timeout"),
        ({"connect_timeout": -math.inf}, "connect_timeout"),
        ({"command_timeout": -1}, "command_timeout"),
        ({"command_timeout": math.nan}, "command_timeout"),
        ({"command_timeout": b"5"}, "command_timeout"),
        ({"command_timeout": -(2**2000)}, "command_timeout"),
        ({"prefix": 5}, "prefix"),
        ({"prefix": b"x:"}, "prefix"),
        ({"prefix": "\ud800"}, "prefix"),
    ],
    ids=repr,
)
def test_bad_client_arguments(kwargs: dict[str, Any], argname: str) -> None:
    _raises_naming(lambda: redmutex.Client("redis://127.0.0.1:6379/0", **kwargs), argname, VT)


@pytest.mark.parametrize(
    ("kwargs", "argname"),
    [
        ({"replicas": -1}, "replicas"),
        ({"replicas": "1"}, "replicas"),
        ({"replicas": 1.5}, "replicas"),
        ({"replicas": 2**2000}, "replicas"),
        ({"on_lost": 5}, "on_lost"),
    ],
    ids=repr,
)
def test_bad_lock_options(client: redmutex.Client, kwargs: dict[str, Any], argname: str) -> None:
    _raises_naming(lambda: redmutex.Lock(client, "x", **kwargs), argname, VT)


@pytest.mark.parametrize(
    ("url", "kinds"),
    [([], VE), ([1, 2, 3], VT), ([b"redis://127.0.0.1:6379"], VT), ([None], VT)],
    ids=["empty", "ints", "bytes", "none"],
)
def test_bad_url_lists(url: Any, kinds: tuple[type[Exception], ...]) -> None:
    _raises_naming(lambda: redmutex.Client(url), "url", kinds)


@pytest.mark.parametrize(
    ("name", "kinds"),
    [("", VE), ("\ud800", VE), (None, (TypeError,)), (b"x", (TypeError,)), (7, (TypeError,))],
    ids=repr,
)
def test_bad_names(client: redmutex.Client, name: Any, kinds: tuple[type[Exception], ...]) -> None:
    _raises_naming(lambda: redmutex.Lock(client, name), "name", kinds)


# ------------------------------------------------------------------------------ property tests

ANYTHING = st.one_of(
    st.text(max_size=50),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=-(2**4000), max_value=2**4000),
    st.none(),
    st.binary(max_size=20),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)

ALLOWED = (ValueError, TypeError)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ttl_class(v: Any) -> str:
    """'good', 'bad' or 'either' per the contract: finite, >= 0.001, fits on the wire."""
    if isinstance(v, bool):
        return "either" if v else "bad"  # True may count as 1 s; False is 0 s or a wrong type
    if v is None:
        return "bad"  # a lease is never infinite, and None is not "the default" either
    if not _is_real(v):
        return "bad"
    x = float(v) if abs(v) < 2**1000 else (math.inf if v > 0 else -math.inf)
    if math.isnan(x) or math.isinf(x) or x < 0.001:
        return "bad"
    if x <= 1e7:
        return "good"
    return "either"  # very long leases: accepted or refused as too large for the wire


def _timeout_class(v: Any, *, none_ok: bool) -> str:
    if v is None:
        return "good" if none_ok else "either"
    if isinstance(v, bool):
        return "either"
    if not _is_real(v):
        return "bad"
    if v < 0:
        return "bad"
    if isinstance(v, float) and math.isnan(v):
        return "bad"
    if v <= 1e6 or (isinstance(v, float) and math.isinf(v)):
        return "good"
    return "either"


def _check(cls: str, fn: Callable[[], object], argname: str) -> object | None:
    """Run fn; enforce the outcome allowed for the argument's class. Returns fn's result."""
    if cls == "good":
        return fn()
    try:
        result = fn()
    except ALLOWED as exc:
        assert argname in str(exc).lower(), (argname, str(exc))
        return None
    assert cls == "either", f"{argname} was accepted but the contract says it is invalid"
    return result


@pytest.mark.timeout(240)
@FUZZ
@given(name=ANYTHING)
def test_fuzz_lock_name(client: redmutex.Client, name: Any) -> None:
    if isinstance(name, str):
        cls = "bad" if name == "" or any(0xD800 <= ord(c) <= 0xDFFF for c in name) else "good"
    else:
        cls = "bad"
    lock = _check(cls, lambda: redmutex.Lock(client, name, ttl=5), "name")
    if isinstance(lock, redmutex.Lock):
        assert lock.acquire(timeout=0) is True
        assert lock.owned()
        lock.release()
        assert not lock.locked()


@pytest.mark.timeout(240)
@FUZZ
@given(name=st.text(min_size=1, max_size=30))
def test_fuzz_names_are_distinct(client: redmutex.Client, name: str) -> None:
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return
    a = redmutex.Lock(client, name, ttl=5)
    b = redmutex.Lock(client, name + "\x00", ttl=5)
    assert a.acquire(timeout=0)
    try:
        assert b.acquire(timeout=0), "two different names collided"
        b.release()
    finally:
        a.release()


@pytest.mark.timeout(240)
@FUZZ
@given(ttl=ANYTHING)
def test_fuzz_lock_ttl(client: redmutex.Client, ttl: Any) -> None:
    name = uuid.uuid4().hex
    lock = _check(_ttl_class(ttl), lambda: redmutex.Lock(client, name, ttl=ttl), "ttl")
    if isinstance(lock, redmutex.Lock):
        try:
            got = lock.acquire(timeout=0)
        except ALLOWED as exc:  # a lease too large for the wire may be refused here
            assert _ttl_class(ttl) == "either"
            assert "ttl" in str(exc).lower()
            return
        assert got is True
        try:
            lock.release()
        except redmutex.LockLostError:
            assert float(ttl) < 0.5  # only a tiny lease may be gone


@pytest.mark.timeout(240)
@FUZZ
@given(timeout=ANYTHING)
def test_fuzz_constructor_timeout(client: redmutex.Client, timeout: Any) -> None:
    name = uuid.uuid4().hex
    cls = _timeout_class(timeout, none_ok=True)
    lock = _check(cls, lambda: redmutex.Lock(client, name, timeout=timeout), "timeout")
    if isinstance(lock, redmutex.Lock):
        assert lock.acquire() is True  # free lock: succeeds at once whatever the timeout
        lock.release()


@pytest.mark.timeout(240)
@FUZZ
@given(timeout=ANYTHING)
def test_fuzz_acquire_timeout_free_lock(client: redmutex.Client, timeout: Any) -> None:
    lock = redmutex.Lock(client, uuid.uuid4().hex, ttl=5)
    cls = _timeout_class(timeout, none_ok=True)
    got = _check(cls, lambda: lock.acquire(timeout=timeout), "timeout")
    if got is None:
        assert lock.token is None
        assert not lock.locked()
    else:
        assert got is True
        lock.release()


@pytest.mark.timeout(240)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(timeout=st.floats(min_value=0, max_value=0.2) | st.integers(0, 0))
def test_fuzz_acquire_timeout_held_lock(client: redmutex.Client, timeout: float) -> None:
    holder = redmutex.Lock(client, "held", ttl=30)
    assert holder.acquire(timeout=0)
    try:
        waiter = redmutex.Lock(client, "held", ttl=5)
        assert waiter.acquire(timeout=timeout) is False
        assert waiter.token is None
    finally:
        holder.release()


@pytest.mark.timeout(240)
@FUZZ
@given(ttl=ANYTHING)
def test_fuzz_extend_ttl(client: redmutex.Client, ttl: Any) -> None:
    lock = redmutex.Lock(client, uuid.uuid4().hex, ttl=5)
    assert lock.acquire(timeout=0)
    cls = "good" if ttl is None else _ttl_class(ttl)
    try:
        _check(cls, lambda: lock.extend(ttl), "ttl")
    finally:
        try:
            lock.release()
        except redmutex.LockLostError:
            assert ttl is not None and float(ttl) < 0.5


URL_TEXT = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda scheme, rest: scheme + rest,
        st.sampled_from(
            ["redis://", "rediss://", "unix://", "redis+unix://", "http://", "redis:", ""]
        ),
        st.text(max_size=40),
    ),
    st.builds(
        lambda host, port, db: f"redis://{host}:{port}/{db}",
        st.sampled_from(["127.0.0.1", "", "[::1]", "a b", "exa mple", "h\x00st"]),
        st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=6)),
        st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=6)),
    ),
)


@pytest.mark.timeout(240)
@FUZZ
@given(url=st.one_of(URL_TEXT, ANYTHING))
def test_fuzz_client_url(url: Any) -> None:
    try:
        c = redmutex.Client(url)
    except ALLOWED as exc:
        assert "url" in str(exc).lower(), str(exc)
        return
    # only a string (or None, perhaps meaning the default) may be accepted, or a non-empty list
    # of URL strings (Redlock masters); a list of non-URLs or an empty list is refused
    redlock = isinstance(url, (list, tuple)) and bool(url) and all(isinstance(u, str) for u in url)
    assert isinstance(url, str) or url is None or redlock, f"accepted {url!r}"
    c.close()


@pytest.mark.timeout(240)
@FUZZ
@given(
    user=st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8),
    password=st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=12, max_size=24),
    tail=st.one_of(
        st.just("/0"), st.text(max_size=12), st.sampled_from([":x/0", ":99999/0", "/db", ":-1"])
    ),
)
def test_fuzz_url_password_never_leaks(user: str, password: str, tail: str) -> None:
    assume(password not in tail)
    url = f"redis://{user}:{password}@127.0.0.1{tail}"
    try:
        c = redmutex.Client(url)
    except ALLOWED as exc:
        assert password not in str(exc)
        assert password not in repr(exc)
        return
    try:
        assert password not in repr(c)
        lock = redmutex.Lock(c, "x")
        assert password not in repr(lock)
    finally:
        c.close()


@pytest.mark.timeout(240)
@FUZZ
@given(connect_timeout=ANYTHING, command_timeout=ANYTHING)
def test_fuzz_client_timeouts(connect_timeout: Any, command_timeout: Any) -> None:
    def cls(v: Any) -> str:
        c = _timeout_class(v, none_ok=False)
        if _is_real(v) and 0 <= v < 0.001:  # type: ignore[operator]
            return "either"  # whether 0 (or below the wire's 1 ms) is a valid timeout is not fixed
        if isinstance(v, float) and math.isinf(v):
            return "either"
        return c

    kinds = {cls(connect_timeout), cls(command_timeout)}
    try:
        c = redmutex.Client(
            "redis://127.0.0.1:6379/0",
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
    except ALLOWED as exc:
        msg = str(exc).lower()
        assert "connect_timeout" in msg or "command_timeout" in msg, msg
        assert kinds != {"good"}, f"valid timeouts refused: {exc}"
        return
    assert "bad" not in kinds, "an invalid timeout was accepted"
    c.close()
