"""The Redis server a benchmark run talks to: a private redis-server, or the one given by URL."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis
from redis.connection import parse_url

if TYPE_CHECKING:
    from typing_extensions import Self

REPO = Path(__file__).resolve().parent.parent


def _redis_server_class() -> Any:
    """`redmutex._server.RedisServer`; loaded from the source tree if the package is not built."""
    try:
        from redmutex._server import RedisServer

        return RedisServer
    except ImportError:
        path = REPO / "python" / "redmutex" / "_server.py"
        spec = importlib.util.spec_from_file_location("_redmutex_server_standalone", path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module.RedisServer


def redact(url: str) -> str:
    """The URL with any password replaced by `***`."""
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", url)


class Target:
    """Starts a private redis-server (no URL) or uses `url`; `close()` stops only what it started."""

    def __init__(self, url: str | None) -> None:
        self._given_url = url
        self._server: Any = None
        self.url = ""

    @property
    def private(self) -> bool:
        return self._given_url is None

    def start(self) -> Self:
        if self._given_url is None:
            self._server = _redis_server_class()().start()
            self.url = self._server.url
        else:
            self.url = self._given_url
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def redis(self) -> redis.Redis:
        """A plain redis-py client for setup, scripts and INFO."""
        return redis.Redis.from_url(self.url, socket_timeout=10, socket_connect_timeout=5)

    def benchmark_args(self) -> list[str]:
        """Connection options for `redis-benchmark` (the password, if any, goes on argv only)."""
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("--redis: redis-benchmark needs a redis://, rediss:// or unix:// URL")
        kwargs = parse_url(self.url)
        args: list[str] = []
        if "path" in kwargs:
            args += ["-s", str(kwargs["path"])]
        else:
            args += [
                "-h",
                str(kwargs.get("host", "127.0.0.1")),
                "-p",
                str(kwargs.get("port", 6379)),
            ]
        if self.url.startswith("rediss://"):
            args.append("--tls")
        if kwargs.get("db"):
            args += ["--dbnum", str(kwargs["db"])]
        if kwargs.get("password"):
            if kwargs.get("username"):
                args += ["--user", str(kwargs["username"])]
            args += ["-a", str(kwargs["password"])]
        return args

    @property
    def display_url(self) -> str:
        return redact(self.url)
