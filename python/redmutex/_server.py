"""A private redis-server on a free loopback port, for the demo, the tests and the benchmarks.

The process is started by us and stopped by its PID only; nothing else is ever signalled.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Starts `redis-server` on 127.0.0.1 with no persistence; `stop()` ends exactly that process.

    `config_file` is passed first (Sentinel needs one it can rewrite: `config_file=path,
    extra_args=["--sentinel"]`).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        extra_args: list[str] | None = None,
        config_file: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.config_file = config_file
        self.process: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.mkdtemp(prefix="redmutex-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, wait: float = 10.0) -> Self:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make deps installs it)")
        args = [
            binary,
            *([self.config_file] if self.config_file else []),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            # A replica's first sync starts at once (diskless sync waits 5 s by default for
            # more replicas to join it): a replicated set-up is up in a fraction of a second.
            "--repl-diskless-sync-delay", "0",
            "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        # A session of its own, so a Ctrl-C meant for the caller does not stop the server before
        # the caller's cleanup has used it.
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    # -NOAUTH: up, but with a password (requirepass in extra_args).
                    if sock.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {wait} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
