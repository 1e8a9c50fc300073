"""The Client section of the contract: URLs, auth, secrecy, lazy connect, timeouts, threads."""

from __future__ import annotations

import builtins
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import quote

import pytest
import redis
import redmutex
from redmutex._client import from_redis
from redmutex._server import RedisServer, free_port

SECRET = "Sup3r-Secret-Pa55word"
ALICE_SECRET = "Al1ce-0wn-Pa55word"


def _lock_key(prefix: str, name: str, suffix: str = "lock") -> bytes:
    return (prefix + "{" + name + "}:" + suffix).encode("utf-8")


def _hold_and_check(
    client: object, prefix: str, conn: redis.Redis, name: str | None = None
) -> None:
    """Acquire a Lock through `client`, check the owner key via `conn`, release."""
    name = name or f"n-{uuid.uuid4().hex[:8]}"
    lock = redmutex.Lock(client, name, ttl=10)
    assert lock.acquire(timeout=5) is True
    try:
        assert lock.token is not None
        assert conn.get(_lock_key(prefix, name)) == lock.token.encode()
    finally:
        lock.release()
    assert conn.exists(_lock_key(prefix, name)) == 0


def _url_works(url: str, prefix: str, conn: redis.Redis, secret: str = SECRET) -> None:
    """A Client on `url` hides `secret`, answers PING and holds a Lock that `conn` sees."""
    c = redmutex.Client(url, prefix=prefix)
    try:
        assert secret not in repr(c)
        assert c.ping() is True
        _hold_and_check(c, prefix, conn)
    finally:
        c.close()


def _exception_texts(exc: BaseException) -> str:
    """str() and repr() of an exception and of everything chained to it."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(str(cur))
        parts.append(repr(cur))
        parts.extend(str(a) for a in cur.args)
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def _connections(conn: redis.Redis) -> int:
    return int(conn.info("clients")["connected_clients"])


# --------------------------------------------------------------------------------------- URLs


@pytest.mark.timeout(30)
@pytest.mark.parametrize("suffix", ["/0", "", "/"])
def test_redis_url_forms(
    redis_server: RedisServer, r: redis.Redis, prefix: str, suffix: str
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}{suffix}"
    with redmutex.Client(url, prefix=prefix) as c:
        assert c.ping() is True
        _hold_and_check(c, prefix, r)


@pytest.mark.timeout(30)
def test_redis_url_selects_db(redis_server: RedisServer, prefix: str) -> None:
    name = "in-db-3"
    db3 = redis.Redis(host="127.0.0.1", port=redis_server.port, db=3)
    db0 = redis.Redis(host="127.0.0.1", port=redis_server.port, db=0)
    try:
        with redmutex.Client(f"redis://127.0.0.1:{redis_server.port}/3", prefix=prefix) as c:
            lock = redmutex.Lock(c, name)
            assert lock.acquire(timeout=5)
            assert lock.token is not None
            assert db3.get(_lock_key(prefix, name)) == lock.token.encode()
            assert db0.exists(_lock_key(prefix, name)) == 0
            lock.release()
            assert db3.exists(_lock_key(prefix, name)) == 0
            assert db3.exists(_lock_key(prefix, name, "fence")) == 1
    finally:
        db3.close()
        db0.close()


def test_a_db_in_the_urls_query_is_the_db_for_every_client(
    redis_server: RedisServer, prefix: str
) -> None:
    # redis-py reads `?db=` (over the path's db): a Lock made from the URL string and one made
    # from redis.Redis.from_url(url) must be in the same database, so they exclude each other.
    url = f"redis://127.0.0.1:{redis_server.port}/0?db=5"
    from_url = redis.Redis.from_url(url)
    try:
        with redmutex.Client(url, prefix=prefix) as c:
            lock = redmutex.Lock(c, "query-db")
            assert lock.acquire(timeout=0)
            assert lock.token is not None
            assert from_url.get(_lock_key(prefix, "query-db")) == lock.token.encode()
            other = redmutex.Lock(from_redis(from_url, prefix=prefix), "query-db")
            assert not other.acquire(timeout=0)
            lock.release()
    finally:
        from_url.close()


@pytest.mark.parametrize("query", ["/0?db=3&db=4", "/3?db=", "/0?db=&db=3", "/3?db=3&password="])
def test_a_query_is_read_as_redis_py_reads_it(
    redis_server: RedisServer, prefix: str, query: str
) -> None:
    # A key's first value wins and an empty value is none, as in redis-py: db 3 every time.
    url = f"redis://127.0.0.1:{redis_server.port}{query}"
    from_url = redis.Redis.from_url(url)
    try:
        assert from_url.connection_pool.connection_kwargs.get("db", 0) in (3, "3")
        with redis.Redis(port=redis_server.port, db=3) as db3:
            _url_works(url, prefix, db3)
    finally:
        from_url.close()


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1:6380/0",
        "rediss://user:" + SECRET + "@127.0.0.1:6380/2",
        "rediss://:" + SECRET + "@127.0.0.1/0",
    ],
)
def test_rediss_url_parses(url: str) -> None:
    c = redmutex.Client(url)
    try:
        assert SECRET not in repr(c)
        assert SECRET not in str(c)
    finally:
        c.close()


@pytest.fixture
def unix_server(
    make_server: Callable[..., RedisServer], tmp_path_factory: pytest.TempPathFactory
) -> tuple[RedisServer, str]:
    sock_dir = tmp_path_factory.mktemp("sock")
    path = str(sock_dir / "redis.sock")
    assert len(path) < 100, "unix socket path too long for this machine's tmp dir"
    server = make_server(["--unixsocket", path, "--unixsocketperm", "700"])
    return server, path


@pytest.mark.timeout(30)
@pytest.mark.parametrize("scheme", ["redis+unix", "unix"])
def test_unix_socket_urls(unix_server: tuple[RedisServer, str], prefix: str, scheme: str) -> None:
    _, path = unix_server
    via_sock = redis.Redis(unix_socket_path=path, db=2)
    try:
        with redmutex.Client(f"{scheme}://{path}?db=2", prefix=prefix) as c:
            assert c.ping() is True
            _hold_and_check(c, prefix, via_sock)
        # without ?db the default db 0 is used
        db0 = redis.Redis(unix_socket_path=path, db=0)
        try:
            with redmutex.Client(f"{scheme}://{path}", prefix=prefix) as c:
                _hold_and_check(c, prefix, db0)
        finally:
            db0.close()
    finally:
        via_sock.close()


@pytest.mark.timeout(30)
def test_unix_socket_with_user_and_password(
    unix_server: tuple[RedisServer, str], prefix: str
) -> None:
    _, path = unix_server
    admin = redis.Redis(unix_socket_path=path)
    try:
        admin.execute_command("ACL", "SETUSER", "sockuser", "on", ">" + SECRET, "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
        as_user = redis.Redis(unix_socket_path=path, db=1, username="sockuser", password=SECRET)
        try:
            # Ours, and redis-py's query names (which were passed over before: Authentication
            # required).
            for query in (
                f"db=1&user=sockuser&pass={SECRET}",
                f"db=1&username=sockuser&password={SECRET}",
            ):
                _url_works(f"unix://{path}?{query}", prefix, as_user)
        finally:
            as_user.close()
    finally:
        admin.close()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "not a url",
        "http://127.0.0.1:6379/0",
        "redis://127.0.0.1:99999/0",
        "redis://127.0.0.1:-1/0",
        "redis://127.0.0.1:port/0",
        "redis://127.0.0.1:6379/notadb",
        "redis://127.0.0.1:6379/-1",
        "redis://127.0.0.1:6379?db=-2",
        "redis://127.0.0.1:6379/0?db=x",
        "redis://[::1/0",
        "unix://",
        "redis+unix://",
    ],
)
def test_malformed_url_raises_value_error_naming_url(url: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        redmutex.Client(url)
    assert "url" in str(excinfo.value).lower()


def test_malformed_url_with_password_does_not_leak_it() -> None:
    with pytest.raises(ValueError) as excinfo:
        redmutex.Client(f"redis://alice:{SECRET}@127.0.0.1:notaport/0")
    assert "url" in str(excinfo.value).lower()
    assert SECRET not in _exception_texts(excinfo.value)


def test_url_of_wrong_type_is_type_error() -> None:
    with pytest.raises(TypeError) as excinfo:
        redmutex.Client(6379)  # type: ignore[arg-type]
    assert "url" in str(excinfo.value).lower()


# ------------------------------------------------------------------------ auth and secrecy


@pytest.fixture
def auth_server(make_server: Callable[..., RedisServer]) -> RedisServer:
    """A server whose default user needs SECRET and that has an ACL user alice/ALICE_SECRET."""
    server = make_server()
    admin = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        admin.execute_command(
            "ACL", "SETUSER", "alice", "on", ">" + ALICE_SECRET, "~*", "&*", "+@all"
        )
        admin.config_set("requirepass", SECRET)
    finally:
        admin.close()
    return server


@pytest.mark.timeout(30)
def test_password_only(auth_server: RedisServer, prefix: str) -> None:
    conn = redis.Redis(host="127.0.0.1", port=auth_server.port, password=SECRET)
    try:
        for url in (
            f"redis://:{SECRET}@127.0.0.1:{auth_server.port}/0",
            f"redis://default:{SECRET}@127.0.0.1:{auth_server.port}/0",
        ):
            _url_works(url, prefix, conn)
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_acl_user(auth_server: RedisServer, prefix: str) -> None:
    conn = redis.Redis(host="127.0.0.1", port=auth_server.port, db=4, password=SECRET)
    try:
        url = f"redis://alice:{ALICE_SECRET}@127.0.0.1:{auth_server.port}/4"
        c = redmutex.Client(url, prefix=prefix)
        try:
            assert ALICE_SECRET not in repr(c)
            assert c.ping() is True
            _hold_and_check(c, prefix, conn)
            lock = redmutex.Lock(c, "x")
            assert ALICE_SECRET not in repr(lock)
        finally:
            c.close()
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_a_user_without_a_password_is_that_user(
    make_server: Callable[..., RedisServer],
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
) -> None:
    # redis-py sends `AUTH svc ""` (a nopass user takes it); without AUTH the connection would
    # act as `default`, which is off here, so that acting as it fails.
    sock = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = make_server(["--unixsocket", sock, "--unixsocketperm", "700"])
    port = server.port
    with redis.Redis(port=port) as admin:
        admin.execute_command("ACL", "SETUSER", "svc", "on", "nopass", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
    as_svc = redis.Redis(port=port, username="svc")
    via_sock = redis.Redis(unix_socket_path=sock, username="svc")
    try:
        assert as_svc.execute_command("ACL", "WHOAMI") == b"svc"
        for client in (
            as_svc,
            via_sock,
            f"redis://svc@127.0.0.1:{port}/0",
            f"redis://svc:@127.0.0.1:{port}/0",
            f"unix://{sock}?user=svc",
            f"redis://127.0.0.1:{port}/0?username=svc",
        ):
            _hold_and_check(client, "redmutex:", as_svc)
    finally:
        as_svc.close()
        via_sock.close()


@pytest.mark.timeout(30)
def test_percent_encoded_credentials(auth_server: RedisServer, prefix: str) -> None:
    odd = "p@ss:w/rd%Odd#?"
    admin = redis.Redis(host="127.0.0.1", port=auth_server.port, password=SECRET)
    try:
        admin.execute_command("ACL", "SETUSER", "od@d:", "on", ">" + odd, "~*", "&*", "+@all")
        userinfo = quote("od@d:", safe="") + ":" + quote(odd, safe="")
        url = f"redis://{userinfo}@127.0.0.1:{auth_server.port}/0"
        c = redmutex.Client(url, prefix=prefix)
        try:
            assert odd not in repr(c) and quote(odd, safe="") not in repr(c)
            assert c.ping() is True
            _hold_and_check(c, prefix, admin)
        finally:
            c.close()
        rp = redis.Redis(host="127.0.0.1", port=auth_server.port, username="od@d:", password=odd)
        try:
            _hold_and_check(rp, "redmutex:", admin, f"pe-{uuid.uuid4().hex}")
        finally:
            rp.close()
    finally:
        admin.close()


@pytest.mark.timeout(60)
def test_wrong_password_raises_connection_error_without_password(
    auth_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-" + SECRET
    caplog.set_level(logging.DEBUG)
    for url in (
        f"redis://:{wrong}@127.0.0.1:{auth_server.port}/0",
        f"redis://alice:{wrong}@127.0.0.1:{auth_server.port}/0",
        f"redis://nosuchuser:{wrong}@127.0.0.1:{auth_server.port}/0",
    ):
        c = redmutex.Client(url, prefix=prefix, connect_timeout=2, command_timeout=2)
        try:
            with pytest.raises(redmutex.ConnectionError) as excinfo:
                c.ping()
            assert wrong not in _exception_texts(excinfo.value)
            assert SECRET not in _exception_texts(excinfo.value)
            lock = redmutex.Lock(c, "guarded", timeout=1)
            with pytest.raises(redmutex.LockError) as excinfo2:
                lock.acquire()
            assert wrong not in _exception_texts(excinfo2.value)
        finally:
            c.close()
    assert wrong not in caplog.text


@pytest.mark.timeout(60)
def test_a_connection_that_cannot_be_set_up_is_a_connection_error(
    redis_server: RedisServer, auth_server: RedisServer, prefix: str
) -> None:
    """SELECT refused while opening the connection (a db the server does not have; a server
    that wants a password, reached without one, on db 3): no connection can be had, so
    `ping()` raises ConnectionError, as it promises, and so does every call that needs one
    (they raised a bare LockError "Redis error: ... refused to switch database")."""
    for url in (
        f"redis://127.0.0.1:{redis_server.port}/99",
        f"redis://127.0.0.1:{auth_server.port}/3",
    ):
        c = redmutex.Client(url, prefix=prefix, connect_timeout=2, command_timeout=2)
        try:
            with pytest.raises(redmutex.ConnectionError, match="switch database"):
                c.ping()
            with pytest.raises(redmutex.ConnectionError):
                redmutex.Lock(c, "guarded").acquire(blocking=False)
            with pytest.raises(redmutex.ConnectionError):
                redmutex.Lock(c, "guarded").acquire(timeout=1)  # a waiter's path
            with pytest.raises(redmutex.ConnectionError):
                redmutex.get_or_fill(c, "entry", lambda: 1, ttl=5)
        finally:
            c.close()


@pytest.mark.timeout(60)
def test_an_acl_user_without_info_works_on_one_server(
    make_server: Callable[..., RedisServer], prefix: str
) -> None:
    """ACLs often take @dangerous away, and INFO with it: one server works without reading
    its run_id (every call failed with "refused the credentials" before); a Redlock master
    cannot, and the error says why and what to grant."""
    servers = [make_server() for _ in range(3)]
    urls = []
    for server in servers:
        with redis.Redis(host="127.0.0.1", port=server.port) as admin:
            admin.execute_command(
                "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all", "-@dangerous"
            )
        urls.append(f"redis://app:app-pw@127.0.0.1:{server.port}/0")
    c = redmutex.Client(urls[0], prefix=prefix, connect_timeout=2, command_timeout=2)
    waiter_client = redmutex.Client(urls[0], prefix=prefix, connect_timeout=2, command_timeout=2)
    try:
        assert c.ping()
        lock = redmutex.Lock(c, "acl", ttl=5)
        assert lock.acquire(blocking=False)
        got: list[bool] = []
        waiter = threading.Thread(
            target=lambda: got.append(redmutex.Lock(waiter_client, "acl").acquire(timeout=5))
        )
        waiter.start()
        time.sleep(0.2)
        lock.release()
        waiter.join(10)
        assert got == [True]
        sem = redmutex.Semaphore(c, "acl-sem", 2)
        assert sem.acquire(blocking=False)
        sem.release()
        assert redmutex.get_or_fill(c, "acl-entry", lambda: 42, ttl=5) == 42
    finally:
        c.close()
        waiter_client.close()
    redlock = redmutex.Client(urls, prefix=prefix, connect_timeout=2, command_timeout=2)
    with pytest.raises(redmutex.LockError, match=r"give the user \+info"):
        redmutex.Lock(redlock, "acl-rl").acquire(blocking=False)


@pytest.mark.timeout(60)
def test_unreachable_error_does_not_contain_password(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = free_port()
    c = redmutex.Client(
        f"redis://alice:{SECRET}@127.0.0.1:{port}/0",
        prefix=prefix,
        connect_timeout=1,
        command_timeout=1,
    )
    try:
        assert SECRET not in repr(c)
        with pytest.raises(redmutex.ConnectionError) as excinfo:
            c.ping()
        assert SECRET not in _exception_texts(excinfo.value)
        with pytest.raises(redmutex.ConnectionError) as excinfo:
            redmutex.Lock(c, "x").acquire()
        assert SECRET not in _exception_texts(excinfo.value)
    finally:
        c.close()
    assert SECRET not in caplog.text


def test_repr_never_contains_password() -> None:
    urls = [
        f"redis://alice:{SECRET}@127.0.0.1:6379/0",
        f"redis://:{SECRET}@127.0.0.1:6379",
        f"unix:///tmp/redis.sock?db=1&user=bob&pass={SECRET}",
        f"redis+unix:///tmp/redis.sock?pass={SECRET}",
    ]
    for url in urls:
        c = redmutex.Client(url)
        try:
            assert SECRET not in repr(c), url
            assert SECRET not in str(c), url
            lock = redmutex.Lock(c, "some-lock")
            assert SECRET not in repr(lock), url
        finally:
            c.close()


# ------------------------------------------------------------------ connecting and timeouts


def test_constructing_does_not_connect_to_unreachable() -> None:
    port = free_port()
    t0 = time.monotonic()
    c = redmutex.Client(f"redis://127.0.0.1:{port}/0", connect_timeout=5, command_timeout=5)
    redmutex.Lock(c, "x", ttl=1)
    assert time.monotonic() - t0 < 1.0
    c.close()


@pytest.mark.timeout(60)
def test_constructing_does_not_connect_and_close_disconnects(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server()
    watcher = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        base = _connections(watcher)  # just the watcher
        c = redmutex.Client(server.url, prefix="lazy:")
        time.sleep(0.3)
        assert _connections(watcher) == base, "Client() connected before first use"
        assert c.ping() is True
        assert _connections(watcher) > base
        c.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _connections(watcher) > base:
            time.sleep(0.05)
        assert _connections(watcher) == base, "close() left connections open"
    finally:
        watcher.close()


@pytest.mark.timeout(60)
def test_refused_connection_raises_connection_error_in_time() -> None:
    port = free_port()
    c = redmutex.Client(f"redis://127.0.0.1:{port}/0", connect_timeout=1, command_timeout=1)
    try:
        t0 = time.monotonic()
        with pytest.raises(redmutex.ConnectionError):
            c.ping()
        assert time.monotonic() - t0 < 2 + 3
        lock = redmutex.Lock(c, "x")  # timeout=None: would wait forever on a held lock
        t0 = time.monotonic()
        with pytest.raises(redmutex.ConnectionError):
            lock.acquire(timeout=None)
        assert time.monotonic() - t0 < 2 + 3
        assert lock.token is None
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_silent_server_raises_connection_error_in_time(blackhole: str) -> None:
    c = redmutex.Client(blackhole, connect_timeout=0.5, command_timeout=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(redmutex.ConnectionError) as excinfo:
            c.ping()
        assert isinstance(excinfo.value, builtins.ConnectionError)
        assert time.monotonic() - t0 < 1.0 + 4
        for timeout in (None, float("inf")):
            lock = redmutex.Lock(c, "x", timeout=timeout)
            t0 = time.monotonic()
            with pytest.raises(redmutex.ConnectionError):
                lock.acquire()
            assert time.monotonic() - t0 < 1.0 + 4
            t0 = time.monotonic()
            with pytest.raises(redmutex.ConnectionError), lock:
                pass
            assert time.monotonic() - t0 < 1.0 + 4
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_server_restart(make_server: Callable[..., RedisServer], prefix: str) -> None:
    server = make_server()
    c = redmutex.Client(server.url, prefix=prefix, connect_timeout=1, command_timeout=1)
    try:
        assert c.ping() is True
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(redmutex.ConnectionError):
            c.ping()
        assert time.monotonic() - t0 < 2 + 4
        server.start()
        deadline = time.monotonic() + 20
        ok = False
        while time.monotonic() < deadline:
            try:
                ok = c.ping()
                break
            except redmutex.ConnectionError:
                time.sleep(0.1)
        assert ok is True, "client did not reconnect after the server came back"
        lock = redmutex.Lock(c, "after-restart", ttl=5)
        assert lock.acquire(timeout=5)
        lock.release()
    finally:
        c.close()


def test_ping_and_context_manager(redis_url: str, prefix: str) -> None:
    with redmutex.Client(redis_url, prefix=prefix) as c:
        assert isinstance(c, redmutex.Client)
        assert c.ping() is True
    c2 = redmutex.Client(redis_url, prefix=prefix)
    assert c2.ping() is True
    c2.close()


def test_client_defaults_are_accepted() -> None:
    # the default URL is well-formed; constructing it must not connect or fail
    c = redmutex.Client()
    c.close()
    c = redmutex.Client(
        url="redis://127.0.0.1:6379/0", prefix="x:", connect_timeout=0.5, command_timeout=0.5
    )
    c.close()


# ------------------------------------------------------------ other forms of "a client"


@pytest.mark.timeout(30)
def test_redis_py_instance_as_client(redis_server: RedisServer) -> None:
    rp = redis.Redis(host="127.0.0.1", port=redis_server.port, db=5)
    try:
        name = f"rp-{uuid.uuid4().hex}"
        lock = redmutex.Lock(rp, name, ttl=10)
        assert lock.acquire(timeout=5)
        assert lock.token is not None
        assert rp.get(_lock_key("redmutex:", name)) == lock.token.encode()
        assert lock.locked() and lock.owned()
        lock.release()
        assert rp.exists(_lock_key("redmutex:", name)) == 0
        assert rp.keys("redmutex:{" + name + "}*") == [_lock_key("redmutex:", name, "fence")]
        rp.delete(_lock_key("redmutex:", name, "fence"))
    finally:
        rp.close()


@pytest.mark.timeout(30)
def test_client_from_redis(redis_server: RedisServer) -> None:
    rp = redis.Redis(host="127.0.0.1", port=redis_server.port, db=6)
    try:
        c = redmutex.Client.from_redis(rp)
        try:
            assert isinstance(c, redmutex.Client)
            assert c.ping() is True
            name = f"fr-{uuid.uuid4().hex}"
            _hold_and_check(c, "redmutex:", rp, name)
            rp.delete(_lock_key("redmutex:", name, "fence"))
        finally:
            c.close()
    finally:
        rp.close()


@pytest.mark.timeout(30)
def test_redis_py_with_password_and_acl_user(auth_server: RedisServer) -> None:
    for kwargs in ({"password": SECRET}, {"username": "alice", "password": ALICE_SECRET}):
        rp = redis.Redis(host="127.0.0.1", port=auth_server.port, db=1, **kwargs)
        try:
            name = f"rpa-{uuid.uuid4().hex}"
            _hold_and_check(rp, "redmutex:", rp, name)
            c = redmutex.Client.from_redis(rp)
            try:
                assert kwargs["password"] not in repr(c)
                assert c.ping() is True
            finally:
                c.close()
        finally:
            rp.close()


@pytest.mark.timeout(30)
def test_redis_py_with_bytes_credentials(auth_server: RedisServer) -> None:
    # redis-py sends bytes as they are; str() would have made the password "b'...'".
    for kwargs in (
        {"password": SECRET.encode()},
        {"username": b"alice", "password": ALICE_SECRET.encode()},
    ):
        rp = redis.Redis(host="127.0.0.1", port=auth_server.port, **kwargs)
        try:
            assert rp.ping() is True
            _hold_and_check(rp, "redmutex:", rp, f"rpb-{uuid.uuid4().hex}")
        finally:
            rp.close()
    odd = redis.Redis(host="127.0.0.1", port=auth_server.port, password=b"\xffS3CRET")
    with pytest.raises(ValueError, match="password is not UTF-8") as caught:
        redmutex.Client.from_redis(odd)
    assert "S3CRET" not in _exception_texts(caught.value)


@pytest.mark.timeout(30)
def test_redis_py_with_a_credential_provider(auth_server: RedisServer) -> None:
    from redis.credentials import UsernamePasswordCredentialProvider

    for provider in (
        UsernamePasswordCredentialProvider(password=SECRET),
        UsernamePasswordCredentialProvider("alice", ALICE_SECRET),
    ):
        rp = redis.Redis(host="127.0.0.1", port=auth_server.port, credential_provider=provider)
        try:
            _hold_and_check(rp, "redmutex:", rp, f"rpc-{uuid.uuid4().hex}")
        finally:
            rp.close()


@pytest.mark.timeout(30)
def test_redis_py_unix_socket_client(unix_server: tuple[RedisServer, str]) -> None:
    _, path = unix_server
    rp = redis.Redis(unix_socket_path=path, db=3)
    try:
        _hold_and_check(rp, "redmutex:", rp, f"ru-{uuid.uuid4().hex}")
    finally:
        rp.close()


@pytest.mark.timeout(30)
def test_redis_py_unix_socket_client_with_an_empty_password(
    unix_server: tuple[RedisServer, str],
) -> None:
    # redis-py sends no AUTH for password="" (and the TCP path drops it): nor does the socket's.
    _, path = unix_server
    rp = redis.Redis(unix_socket_path=path, db=3, password="")
    try:
        assert rp.ping() is True
        _hold_and_check(rp, "redmutex:", rp, f"rue-{uuid.uuid4().hex}")
    finally:
        rp.close()


@pytest.mark.timeout(30)
def test_url_string_as_client(redis_url: str, r: redis.Redis) -> None:
    name = f"us-{uuid.uuid4().hex}"
    _hold_and_check(redis_url, "redmutex:", r, name)
    r.delete(_lock_key("redmutex:", name, "fence"))


def test_bad_client_type() -> None:
    with pytest.raises(TypeError) as excinfo:
        redmutex.Lock(12345, "x")  # type: ignore[arg-type]
    assert "client" in str(excinfo.value).lower()


# ------------------------------------------------------------------ threads and fork


@pytest.mark.timeout(120)
def test_many_threads_share_one_client(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    errors: list[BaseException] = []
    fences: dict[str, list[int]] = {}
    guard = threading.Lock()
    start = threading.Barrier(16)

    def worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            for j in range(20):
                assert client.ping() is True
                own = redmutex.Lock(client, f"own-{i}", ttl=10)
                assert own.acquire(timeout=10)
                assert own.owned()
                own.release()
                shared = redmutex.Lock(client, f"shared-{j % 3}", ttl=10)
                with shared:
                    assert shared.fence is not None
                    with guard:
                        fences.setdefault(f"shared-{j % 3}", []).append(shared.fence)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for name, seen in fences.items():
        # appended under the lock, so in order of hold: strictly increasing
        assert seen == sorted(seen) and len(set(seen)) == len(seen), name
    # nothing but fence counters remains
    leftover = {k for k in r.keys(prefix + "*") if not k.endswith(b":fence")}
    assert leftover == set()


def _fork_and_run(
    child: Callable[[], dict[str, object]], timeout: float = 30.0
) -> dict[str, object]:
    """Fork; run `child` in the child, send its result back as JSON; reap the child."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(rfd)
            try:
                result = child()
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                result = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(wfd, "w") as f:
                json.dump(result, f)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(rfd)
        raise AssertionError(f"forked child did not finish within {timeout} s")
    with os.fdopen(rfd) as f:
        data = f.read()
    assert status == 0, f"child exited with status {status}"
    result = json.loads(data)
    assert isinstance(result, dict)
    return result


@pytest.mark.timeout(90)
def test_fork_child_uses_inherited_client_and_holds_nothing(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    parent_lock = redmutex.Lock(client, "parent-held", ttl=30)
    assert parent_lock.acquire(timeout=5)
    token = parent_lock.token
    assert token is not None

    def child() -> dict[str, object]:
        out: dict[str, object] = {}
        out["ping"] = client.ping()
        out["owned"] = parent_lock.owned()
        out["token"] = parent_lock.token
        out["locked"] = parent_lock.locked()
        try:
            out["acquire0"] = parent_lock.acquire(timeout=0)
        except BaseException as exc:  # noqa: BLE001
            out["acquire0"] = f"{type(exc).__name__}: {exc}"
        try:
            parent_lock.release()
            out["release"] = "no error"
        except redmutex.LockNotOwnedError:
            out["release"] = "LockNotOwnedError"
        except BaseException as exc:  # noqa: BLE001
            out["release"] = f"{type(exc).__name__}: {exc}"
        mine = redmutex.Lock(client, "child-own", ttl=10)
        out["child_acquire"] = mine.acquire(timeout=5)
        out["child_owned"] = mine.owned()
        mine.release()
        out["child_owned_after"] = mine.owned()
        return out

    result = _fork_and_run(child)
    assert result == {
        "ping": True,
        "owned": False,
        "token": None,
        "locked": True,
        "acquire0": False,
        "release": "LockNotOwnedError",
        "child_acquire": True,
        "child_owned": True,
        "child_owned_after": False,
    }
    # the parent's hold is untouched, and the parent still works after the fork
    assert r.get(_lock_key(prefix, "parent-held")) == token.encode()
    assert parent_lock.owned()
    assert parent_lock.token == token
    assert client.ping() is True
    parent_lock.release()
    assert not parent_lock.locked()


@pytest.mark.timeout(90)
def test_fork_while_another_thread_waits_leaves_the_objects_usable_in_the_child(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis
) -> None:
    """A thread of the parent waits in `acquire()` when another thread forks: the child has no
    such thread, so the same objects try and fail like any busy acquire there (they refused for
    good, as 'already acquiring in another thread', before)."""
    blocker = redmutex.Lock(other_client, "fork-waiting", ttl=30)
    sem_blocker = redmutex.Semaphore(other_client, "fork-waiting-sem", 1, ttl=30)
    assert blocker.acquire(timeout=5) and sem_blocker.acquire(timeout=5)
    lock = redmutex.Lock(client, "fork-waiting", ttl=30)
    sem = redmutex.Semaphore(client, "fork-waiting-sem", 1, ttl=30)
    waiters = [threading.Thread(target=obj.acquire, kwargs={"timeout": 30}) for obj in (lock, sem)]
    for waiter in waiters:
        waiter.start()
    try:
        # Both parent threads are inside acquire() once their places show in the queues.
        queues = [_lock_key(client.prefix, "fork-waiting", "lock:queue"),
                  _lock_key(client.prefix, "fork-waiting-sem", "sem:queue")]  # fmt: skip
        deadline = time.monotonic() + 10
        while r.exists(*queues) < 2:
            assert time.monotonic() < deadline, "the waiters did not queue"
            time.sleep(0.01)

        def child() -> dict[str, object]:
            out: dict[str, object] = {}
            for label, obj in (("lock", lock), ("semaphore", sem)):
                try:
                    out[label] = obj.acquire(timeout=0)
                except redmutex.LockError as exc:
                    out[label] = f"{type(exc).__name__}: {exc}"
            return out

        assert _fork_and_run(child) == {"lock": False, "semaphore": False}
        blocker.release()
        sem_blocker.release()
        for waiter in waiters:
            waiter.join(timeout=30)
        assert lock.token is not None and sem.token is not None  # the parent's waits went on
    finally:
        for waiter in waiters:
            waiter.join(timeout=30)
        for obj in (lock, sem, blocker, sem_blocker):
            if obj.token is not None:
                obj.release()


@pytest.mark.timeout(90)
def test_fork_before_first_use(redis_url: str, prefix: str) -> None:
    c = redmutex.Client(redis_url, prefix=prefix)
    try:

        def child() -> dict[str, object]:
            lock = redmutex.Lock(c, "fresh", ttl=5)
            got = lock.acquire(timeout=5)
            lock.release()
            return {"ping": c.ping(), "got": got}

        assert _fork_and_run(child) == {"ping": True, "got": True}
        assert c.ping() is True
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_fork_child_never_repeats_the_parents_next_tokens(client: redmutex.Client) -> None:
    """Tokens come from a per-thread batch of OS randomness (and the process id is cached):
    a forked child must draw a fresh batch, never the bytes its parent hands out next."""
    lock = redmutex.Lock(client, "fork-tokens", ttl=10)

    def tokens(count: int) -> list[str]:
        drawn = []
        for _ in range(count):
            assert lock.acquire(timeout=5)
            token = lock.token
            assert token is not None
            drawn.append(token)
            lock.release()
        return drawn

    tokens(1)  # the parent's batch is drawn and partly used before the fork

    def child() -> dict[str, object]:
        return {"tokens": tokens(4)}

    theirs = _fork_and_run(child)["tokens"]
    assert isinstance(theirs, list)
    mine = tokens(4)
    assert len(set(mine) | set(theirs)) == 8, (mine, theirs)


@pytest.mark.timeout(90)
def test_fork_multiprocessing_context(client: redmutex.Client) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    held = redmutex.Lock(client, "mp-held", ttl=30)
    assert held.acquire(timeout=5)
    q = ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(client, held, q))
    p.start()
    try:
        result = q.get(timeout=60)
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    assert result == {"owned": False, "acquire0": False, "ping": True}
    assert p.exitcode == 0
    assert held.owned()
    held.release()


def _mp_child(client: redmutex.Client, held: redmutex.Lock, q: object) -> None:
    out: dict[str, object] = {}
    try:
        out["owned"] = held.owned()
        out["acquire0"] = held.acquire(timeout=0)
        out["ping"] = client.ping()
    except BaseException as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
    q.put(out)  # type: ignore[attr-defined]
