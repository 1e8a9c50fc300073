"""The private redis-server of the demo, tests and benchmarks (`redmutex._server.RedisServer`).

A free port can be taken by another process between being chosen and being bound (tests run in
parallel workers): the server then chooses again, and it never takes another server's answer on
the port for its own start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from redmutex import _server
from redmutex._server import RedisServer


@pytest.fixture
def other() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_a_chosen_port_taken_meanwhile_is_chosen_again(
    other: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([other.port, _server.free_port()])
    monkeypatch.setattr(_server, "free_port", lambda: next(ports))
    server = RedisServer()
    assert server.port == other.port
    with server:
        assert server.port != other.port
        assert server.process is not None and server.process.poll() is None
        info = redis.Redis.from_url(server.url).info("server")
        assert info["process_id"] == server.process.pid
    # The other server was only looked at.
    assert other.process is not None and other.process.poll() is None


def test_a_named_port_taken_is_an_error(other: RedisServer) -> None:
    server = RedisServer(other.port)
    with pytest.raises(RuntimeError, match="exited with"):
        server.start()
    assert server.process is not None and server.process.poll() is not None
    assert other.process is not None and other.process.poll() is None


def test_a_bus_port_taken_meanwhile_is_chosen_again(
    other: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port of the server's own besides its main one (`FREE_PORT` in its arguments, here a
    cluster bus port) is chosen afresh too when it was taken."""
    real = _server.free_port
    ports = iter([real(), other.port])
    monkeypatch.setattr(_server, "free_port", lambda: next(ports, None) or real())
    server = RedisServer(
        extra_args=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", _server.FREE_PORT,
        ]
    )  # fmt: skip
    with server:
        assert len(server.extra_ports) == 1 and server.extra_ports[0] != other.port
        assert server.process is not None
        info = redis.Redis.from_url(server.url).info("server")
        assert info["process_id"] == server.process.pid
    assert other.process is not None and other.process.poll() is None


def test_close_removes_the_directory_and_a_closed_server_starts_again() -> None:
    server = RedisServer()
    with server.start() as entered:  # entering a started server starts no second one
        assert entered is server
        first = server.process
        assert first is not None and first.poll() is None
    assert first.poll() is not None
    assert not os.path.exists(server.dir)
    try:
        server.start()
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.close()
    assert not os.path.exists(server.dir)
