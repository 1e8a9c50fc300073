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


PORT_ATTEMPTS = 5
# In `extra_args`: a port of the server's own besides its main one (a cluster bus port), chosen
# afresh like the main port at each attempt to start; the ones in use are `extra_ports`.
FREE_PORT = "{free port}"
NOAUTH = -1  # `_answering_pid` of a server that wants a password first (up, but unnamed)


def _answering_pid(port: int, *, loaded: bool = True) -> int | None:
    """The process id of the redis-server answering on `port` (`NOAUTH` when it asks for a
    password first), or None while nothing answers; with `loaded`, also None while the server
    is still loading its dataset (INFO answers then, but a lock's command would get LOADING)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"INFO\r\n")
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                reply += chunk
            if reply.startswith(b"-NOAUTH"):
                return NOAUTH
            if not reply.startswith(b"$"):
                return None  # another error: not up yet
            header, body = reply.split(b"\r\n", 1)
            size = int(header[1:]) + 2  # the text and its closing CRLF
            while len(body) < size:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                body += chunk
    except (OSError, ValueError):
        return None
    fields = dict(line.split(b":", 1) for line in body.split(b"\r\n") if b":" in line)
    if b"process_id" not in fields or (loaded and fields.get(b"loading", b"0") != b"0"):
        return None
    return int(fields[b"process_id"])


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
        # A port we chose may be taken by someone else before our server binds it: then we
        # choose again (a port the caller named is kept, and its loss is an error).
        self.chosen_port = port is None
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.extra_ports: list[int] = []
        self.config_file = config_file
        self.process: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.mkdtemp(prefix="redmutex-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, wait: float = 10.0, *, until_loaded: bool = True) -> Self:
        """Starts the server and returns once it serves: with `until_loaded=False`, as soon as it
        answers, which may be while it still loads its data from disk."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make deps installs it)")
        os.makedirs(self.dir, exist_ok=True)  # removed by an earlier close()
        for _ in range(PORT_ATTEMPTS):
            if self._launch(binary, wait, until_loaded):
                return self
            if self.chosen_port:
                self.port = free_port()
        raise RuntimeError(f"redis-server found no free port in {PORT_ATTEMPTS} attempts")

    def _launch(self, binary: str, wait: float, until_loaded: bool) -> bool:
        """Starts the server on `self.port`; False if a port we chose was taken."""
        self.extra_ports = [free_port() for arg in self.extra_args if arg == FREE_PORT]
        chosen = iter(self.extra_ports)
        extra = [str(next(chosen)) if arg == FREE_PORT else arg for arg in self.extra_args]
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
            *extra,
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
                if self._port_taken():
                    return False
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            # Another server on the port answers too: only our own process counts as up.
            if _answering_pid(self.port, loaded=until_loaded) in (self.process.pid, NOAUTH):
                return True
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {wait} s")

    def _port_taken(self) -> bool:
        ours = [self.port, *self.extra_ports] if self.chosen_port else self.extra_ports
        with open(os.path.join(self.dir, "redis.log"), errors="replace") as log:
            text = log.read()
        return any(f"127.0.0.1:{port}: bind: Address already in use" in text for port in ours)

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

    def close(self) -> None:
        """Stops the server and removes its directory (its log): the end of its life."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self if self.process is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
