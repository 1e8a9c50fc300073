"""Errors say what and where (issue 14 item 5).

A ConnectionError names the endpoint (never the password) and says "timed out after N s" when
it timed out; a LockError about one primitive says its name and carries it whole as `.name`;
the "on_lost callback raised" log record names the lock and has the traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redmutex
from redmutex import aio
from redmutex._server import RedisServer

SECRET = "pw-never-shown-4711"
FAST = {"connect_timeout": 0.4, "command_timeout": 0.4}


def refused_port() -> int:
    """A loopback port nobody listens on: bound to learn a free one, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) but never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def connection_error(call: Callable[[], Any], limit: float = 10.0) -> redmutex.ConnectionError:
    started = time.monotonic()
    with pytest.raises(redmutex.ConnectionError) as info:
        call()
    assert time.monotonic() - started < limit
    message = str(info.value)
    assert SECRET not in message and SECRET not in repr(info.value), message
    return info.value


# ------------------------------------------------------------------ connection errors: where


def test_refused_port_names_host_and_port() -> None:
    port = refused_port()
    client = redmutex.Client(f"redis://:{SECRET}@127.0.0.1:{port}/0", **FAST)
    err = connection_error(client.ping)
    assert f"127.0.0.1:{port}" in str(err), err
    assert err.name is None
    err = connection_error(lambda: redmutex.Lock(client, "refused").acquire())
    assert f"127.0.0.1:{port}" in str(err) and "'refused'" in str(err), err
    assert err.name == "refused"
    err = connection_error(lambda: redmutex.Lock(client, "w").acquire(timeout=5))
    assert f"127.0.0.1:{port}" in str(err)


def test_silent_server_says_timed_out(silent: int) -> None:
    client = redmutex.Client(f"redis://:{SECRET}@127.0.0.1:{silent}/0", **FAST)
    for call in (
        client.ping,
        lambda: redmutex.Lock(client, "quiet").acquire(),
        lambda: redmutex.Semaphore(client, "quiet", 2).acquire(),
    ):
        err = connection_error(call)
        assert f"127.0.0.1:{silent}" in str(err), err
        assert "timed out after" in str(err), err
        assert "os error" not in str(err), err


def test_silent_server_aio(silent: int) -> None:
    client = redmutex.Client(f"redis://:{SECRET}@127.0.0.1:{silent}/0", **FAST)

    async def main() -> None:
        await aio.Lock(client, "quiet").acquire()

    err = connection_error(lambda: asyncio.run(main()))
    assert f"127.0.0.1:{silent}" in str(err) and "timed out after" in str(err), err
    assert err.name == "quiet"


def test_cluster_and_sentinel_name_their_nodes(silent: int) -> None:
    cluster = redmutex.Client(cluster=[f"redis://:{SECRET}@127.0.0.1:{silent}/0"], **FAST)
    err = connection_error(lambda: redmutex.Lock(cluster, "c").acquire())
    assert f"cluster [127.0.0.1:{silent}]" in str(err) and "timed out after" in str(err), err
    port = refused_port()
    sentinel = redmutex.Client(
        f"redis+sentinel://u:{SECRET}@127.0.0.1:{port}/svc?sentinel_password={SECRET}", **FAST
    )
    err = connection_error(sentinel.ping)
    assert f"127.0.0.1:{port}" in str(err) and "'svc'" in str(err), err


def test_missing_unix_socket_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nobody-here.sock"
    client = redmutex.Client(f"unix://{path}?db=0&pass={SECRET}", **FAST)
    err = connection_error(client.ping)
    assert str(path) in str(err), err
    err = connection_error(lambda: redmutex.Lock(client, "sock").acquire())
    assert str(path) in str(err) and err.name == "sock", err


def test_stopped_server_times_out_with_the_limit(
    make_server: Callable[..., RedisServer],
) -> None:
    server = make_server(extra_args=["--requirepass", SECRET])
    assert server.process is not None
    client = redmutex.Client(
        f"redis://:{SECRET}@127.0.0.1:{server.port}/0", connect_timeout=0.5, command_timeout=0.3
    )
    lock = redmutex.Lock(client, "stopped")
    assert lock.acquire()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        err = connection_error(lock.release)
        assert f"127.0.0.1:{server.port}" in str(err), err
        assert "timed out after 0.3 s" in str(err), err
        assert err.name == "stopped"
        err = connection_error(lambda: redmutex.Lock(client, "other").locked())
        assert "timed out after" in str(err), err
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_timeouts_say_so_without_a_password_too(
    silent: int, make_server: Callable[..., RedisServer]
) -> None:
    # Without AUTH in the handshake, the first request on a new connection is the one that
    # reads the server's identity: its timeout names the limit like any other.
    client = redmutex.Client(f"redis://127.0.0.1:{silent}/0", **FAST)
    err = connection_error(lambda: redmutex.Lock(client, "quiet").acquire())
    assert "timed out after" in str(err) and "os error" not in str(err), err
    server = make_server()
    assert server.process is not None
    client = redmutex.Client(server.url, connect_timeout=0.5, command_timeout=0.3)
    lock = redmutex.Lock(client, "stopped")
    assert lock.acquire()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        # The first call times out on its connection; the next ones open new connections.
        for call in (lock.owned, lambda: redmutex.Lock(client, "other").locked(), lock.release):
            err = connection_error(call)
            assert "timed out after 0.3 s" in str(err) and "os error" not in str(err), err
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_redlock_names_the_masters(redis_url: str) -> None:
    ports = [refused_port(), refused_port()]
    client = redmutex.Client(
        [redis_url] + [f"redis://:{SECRET}@127.0.0.1:{p}/0" for p in ports], **FAST
    )
    with pytest.raises(redmutex.LockError) as info:
        redmutex.Lock(client, "rl").acquire(timeout=0)
    message = str(info.value)
    assert SECRET not in message
    assert isinstance(info.value, (redmutex.QuorumError, redmutex.ConnectionError)), info.value
    assert info.value.name == "rl"
    assert any(f"127.0.0.1:{p}" in message for p in ports), message


# ------------------------------------------------------------------ lock errors: which one


def test_not_owned_timeout_and_lost_carry_the_name(client: redmutex.Client) -> None:
    lock = redmutex.Lock(client, "job:1", ttl=5)
    with pytest.raises(redmutex.LockNotOwnedError) as not_owned:
        lock.release()
    assert not_owned.value.name == "job:1" and "'job:1'" in str(not_owned.value)

    assert lock.acquire()
    other = redmutex.Lock(client, "job:1", timeout=0)
    with pytest.raises(redmutex.LockTimeoutError) as timed_out, other:
        pass
    assert timed_out.value.name == "job:1" and "'job:1'" in str(timed_out.value)
    lock.release()

    short = redmutex.Lock(client, "job:2", ttl=0.05)
    with pytest.raises(redmutex.LockLostError) as lost, short:
        time.sleep(0.3)
        assert redmutex.Lock(client, "job:2").acquire(blocking=False)
    assert lost.value.name == "job:2" and "'job:2'" in str(lost.value)
    assert "lock was lost" in str(lost.value)

    short = redmutex.Lock(client, "job:3", ttl=0.05)
    assert short.acquire()
    time.sleep(0.3)
    with pytest.raises(redmutex.LockLostError) as lost:
        short.extend()
    assert lost.value.name == "job:3"


def test_semaphore_and_rwlock_names(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "pool", 1, timeout=0)
    with pytest.raises(redmutex.LockNotOwnedError) as info:
        sem.release()
    assert info.value.name == "pool" and "semaphore 'pool'" in str(info.value)
    with (
        sem,
        pytest.raises(redmutex.LockTimeoutError) as timeout,
        redmutex.Semaphore(client, "pool", 1, timeout=0),
    ):
        pass
    assert timeout.value.name == "pool"

    rw = redmutex.RWLock(client, "doc", timeout=0)
    with pytest.raises(redmutex.LockNotOwnedError) as info:
        rw.write().release()
    assert info.value.name == "doc" and "write lock 'doc'" in str(info.value)


def test_cache_connection_errors_name_the_entry() -> None:
    """The cache's connection errors say the entry and carry it as `.name`, as its timeout
    error does (they carried None and said only the endpoint)."""
    port = refused_port()
    client = redmutex.Client(f"redis://:{SECRET}@127.0.0.1:{port}/0", **FAST)

    @redmutex.cached(client, ttl=5, key="report:{n}")
    def report(n: int) -> int:
        return n

    @aio.cached(client, ttl=5, key="areport:{n}")
    async def areport(n: int) -> int:
        return n

    async def fill() -> int:
        return 1

    for call, entry in (
        (lambda: redmutex.get_or_fill(client, "gk", lambda: 1, ttl=5), "gk"),
        (lambda: report(7), "report:7"),
        (lambda: report.invalidate(7), "report:7"),
        (lambda: asyncio.run(aio.get_or_fill(client, "agk", fill, ttl=5)), "agk"),
        (lambda: asyncio.run(areport(8)), "areport:8"),
        (lambda: asyncio.run(areport.invalidate(8)), "areport:8"),
    ):
        err = connection_error(call)
        assert err.name == entry, (err.name, str(err))
        assert f"cache entry '{entry}'" in str(err) and f"127.0.0.1:{port}" in str(err), err


def test_long_names_are_shortened_in_messages(client: redmutex.Client) -> None:
    name = "n" * 300_000
    lock = redmutex.Lock(client, name)
    with pytest.raises(redmutex.LockNotOwnedError) as info:
        lock.release()
    message = str(info.value)
    assert len(message) < 1000, len(message)
    assert "n" * 200 + "…" in message
    assert info.value.name == name


def test_aio_errors_carry_the_name(client: redmutex.Client) -> None:
    async def main() -> None:
        lock = aio.Lock(client, "alock", timeout=0)
        with pytest.raises(redmutex.LockNotOwnedError) as info:
            await lock.release()
        assert info.value.name == "alock" and "'alock'" in str(info.value)
        async with lock:
            with pytest.raises(redmutex.LockTimeoutError) as timeout:
                async with aio.Lock(client, "alock", timeout=0):
                    pass
            assert timeout.value.name == "alock"
        sem = aio.Semaphore(client, "asem", 1)
        with pytest.raises(redmutex.LockNotOwnedError) as info:
            await sem.extend()
        assert info.value.name == "asem"

    asyncio.run(main())


def test_redis_lock_errors_carry_the_name(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    holder = redmutex.Lock(client, "book")
    assert holder.acquire()
    with pytest.raises(redmutex.LockError) as info, redmutex.redis_lock(client, "book", atime=0):
        pass
    assert type(info.value) is redmutex.LockError
    assert info.value.name == "book" and "could not acquire lock" in str(info.value)
    assert "'book'" in str(info.value)
    holder.release()

    with pytest.raises(redmutex.LockLostError) as lost, redmutex.redis_lock(client, "book"):
        r.delete(f"{prefix}{{book}}:lock")
    assert lost.value.name == "book" and "lock was lost" in str(lost.value)


def test_exceptions_keep_plain_construction_and_pickle() -> None:
    classes = (
        redmutex.LockError,
        redmutex.LockTimeoutError,
        redmutex.LockNotOwnedError,
        redmutex.LockLostError,
        redmutex.QuorumError,
        redmutex.ConnectionError,
    )
    for cls in classes:
        plain = cls("msg")
        assert str(plain) == "msg" and plain.name is None
        named = cls("about x", name="x")
        back = pickle.loads(pickle.dumps(named))
        assert type(back) is cls and str(back) == "about x" and back.name == "x"


def test_raised_errors_pickle_with_their_name(client: redmutex.Client) -> None:
    with pytest.raises(redmutex.LockNotOwnedError) as info:
        redmutex.Lock(client, "pick").release()
    back = pickle.loads(pickle.dumps(info.value))
    assert back.name == "pick" and str(back) == str(info.value)


# ------------------------------------------------------------------ the on_lost log record


def test_on_lost_log_names_the_lock_with_traceback(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()

    def on_lost(_lock: Any) -> None:
        called.set()
        raise RuntimeError("callback broke")

    caplog.set_level(logging.ERROR, logger="redmutex")
    lock = redmutex.Lock(client, "watched", ttl=0.6, auto_renew=True, on_lost=on_lost)
    assert lock.acquire()
    r.delete(f"{prefix}{{watched}}:lock")
    assert called.wait(10), "on_lost was not called"
    deadline = time.monotonic() + 10
    records: list[logging.LogRecord] = []
    while time.monotonic() < deadline and not records:
        records = [rec for rec in caplog.records if "on_lost callback raised" in rec.getMessage()]
        time.sleep(0.05)
    assert records, [rec.getMessage() for rec in caplog.records]
    record = records[0]
    assert "'watched'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert record.exc_info[2] is not None  # the traceback
    assert "callback broke" in caplog.text and "Traceback" in caplog.text
    with pytest.raises(redmutex.LockLostError):
        lock.release()
