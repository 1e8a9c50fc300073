"""Running `python -m redmutex ...` as a subprocess for the CLI tests: plainly, for its JSON, or
with a pseudo-terminal that answers its confirmation question."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from typing import Any


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "redmutex", *args],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=environment,
        timeout=timeout,
    )


def cli_json(*args: str) -> tuple[int, Any]:
    done = run_cli(*args, "--json")
    assert done.stderr == "", done.stderr
    return done.returncode, json.loads(done.stdout)


def release_on_a_terminal(args: list[str], answer: bytes, timeout: float = 30.0) -> tuple[int, str]:
    """Runs the CLI with a pseudo-terminal as stdin (and stderr), answering its question."""
    controller, terminal = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "redmutex", *args],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=environment,
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + timeout
        while b"[y/N]" not in seen:
            assert time.monotonic() < deadline, f"no question asked: {seen!r}"
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(controller, 1024)
                except OSError:
                    break
        os.write(controller, answer)
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        os.close(controller)
    return proc.returncode, seen.decode() + stdout.decode()
