"""Shared fixtures: real redis-server processes on loopback, clients, helpers for subprocesses.

Every process started here is stopped by its PID at teardown (RedisServer.stop, Popen.kill).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
import redis
import redmutex
from redmutex._server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[redmutex.Client]:
    c = redmutex.Client(redis_url, prefix=prefix)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def r2(redis_url: str) -> Iterator[redis.Redis]:
    """A second redis-py client (another pool): stands for another process."""
    conn = redis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def key_of(prefix: str) -> Callable[[str, str], bytes]:
    """key_of(name, "lock") -> the raw Redis key `prefix{name}:lock` as bytes."""

    def _key(name: str, suffix: str) -> bytes:
        return (prefix + "{" + name + "}:" + suffix).encode("utf-8")

    return _key


@pytest.fixture
def make_server() -> Iterator[Callable[..., RedisServer]]:
    """Start an extra, test-owned redis-server: make_server(extra_args=[...], port=None)."""
    started: list[RedisServer] = []

    def _make(extra_args: list[str] | None = None, port: int | None = None) -> RedisServer:
        server = RedisServer(port, extra_args=extra_args)
        started.append(server)
        return server.start()

    yield _make
    for server in started:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """URL of a loopback TCP port that accepts connections (kernel backlog) but never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        sock.close()


class PyProcs:
    """Runs `python -c SCRIPT args...` children; every child is killed and reaped at teardown."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[str]] = []

    def start(self, script: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.children.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=10)
            raise AssertionError(f"child did not finish within {timeout} s; stderr:\n{err}")
        return proc.returncode, out, err

    def run(self, script: str, *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
        return self.wait(self.start(script, *args), timeout)

    def cleanup(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass


@pytest.fixture
def procs() -> Iterator[PyProcs]:
    pool = PyProcs()
    try:
        yield pool
    finally:
        pool.cleanup()


class MpProcs:
    """`multiprocessing` children ("fork" or "spawn" context) owned by one test.

    Every child is SIGKILLed (by its PID) if still alive and joined at teardown.
    """

    def __init__(self) -> None:
        self.children: list[BaseProcess] = []

    @staticmethod
    def ctx(method: str = "fork") -> BaseContext:
        return multiprocessing.get_context(method)

    def start(self, target: Callable[..., object], *args: Any, method: str = "fork") -> BaseProcess:
        proc = self.ctx(method).Process(target=target, args=args, daemon=True)  # type: ignore[attr-defined]
        proc.start()
        self.children.append(proc)
        return proc

    def kill(self, proc: BaseProcess, timeout: float = 10.0) -> None:
        """SIGKILL one child (if alive) and reap it.

        Reaps by polling `exitcode` (waitpid) rather than by `join()` alone: join waits on a pipe
        that a grandchild forked by the child may keep open long after the child died.
        """
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.join(0.1)

    def cleanup(self) -> None:
        for proc in self.children:
            self.kill(proc)


@pytest.fixture
def mp_procs() -> Iterator[MpProcs]:
    pool = MpProcs()
    try:
        yield pool
    finally:
        pool.cleanup()


@pytest.fixture
def other_client(redis_url: str, prefix: str) -> Iterator[redmutex.Client]:
    """A second, independent Client (its own connections) on the same prefix."""
    c = redmutex.Client(redis_url, prefix=prefix)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes started by a test; each is SIGKILLed (by PID) if alive, and reaped."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            pass


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made with openssl: (cert, key)
    files, one pair per test module."""
    d: Path = tmp_path_factory.mktemp("loopback-tls")
    cert, key_file = d / "server.pem", d / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key_file),
            "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-addext", "basicConstraints=critical,CA:TRUE",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return str(cert), str(key_file)
