"""Small helpers shared by the test modules (threads that keep their outcome, waiting for a
condition, a check run in a forked child, how soon a release wakes a waiter, counting Redis
commands, a server paused by SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

import redis

if TYPE_CHECKING:
    from redmutex._server import RedisServer


class ResultThread(threading.Thread):
    """A daemon thread that keeps its target's result or exception and when it finished."""

    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._fn = target
        self.result: object = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        finally:
            self.finished_at = time.monotonic()

    def outcome(self, timeout: float) -> object:
        self.join(timeout)
        assert not self.is_alive(), f"thread did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


def in_a_forked_child(check: Callable[[], Any], timeout: float = 30) -> Any:
    """Runs `check` in a child made by os.fork() and returns its result (JSON-able) as the
    child reported it; the child exits at once with os._exit, and is killed past `timeout`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(check()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    reaped = False
    try:
        deadline = time.monotonic() + timeout
        while not reaped:
            reaped = os.waitpid(pid, os.WNOHANG)[0] == pid
            assert reaped or time.monotonic() < deadline, "the forked child did not finish"
            time.sleep(0.01)
        with os.fdopen(read) as f:
            text = f.read()
        assert text, "the forked child reported nothing (it failed)"
        return json.loads(text)
    finally:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def wake_delay(
    release: Callable[[], object],
    acquire: Callable[[], object],
    then: Callable[[], object] | None = None,
    settle: float = 0.3,
    timeout: float = 20.0,
) -> float:
    """Seconds from `release()` until a waiter got what it released: `acquire` runs in a thread
    started `settle` s before the release (so that it is waiting by then) and must return true;
    `then` runs after it in that thread (the waiter's own release)."""

    def wait() -> float:
        got = acquire()
        at = time.monotonic()
        assert got, "the waiter did not get it"
        if then is not None:
            then()
        return at

    waiter = ResultThread(wait)
    waiter.start()
    time.sleep(settle)
    released = time.monotonic()
    release()
    woken = waiter.outcome(timeout)
    assert isinstance(woken, float)
    return woken - released


def command_calls(conn: redis.Redis) -> dict[str, int]:
    """Calls per command from INFO commandstats (script-internal calls included), minus INFO."""
    stats = conn.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name != "cmdstat_info"
    }


def calls_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: n - before.get(k, 0) for k, n in after.items()}
    return {k: n for k, n in out.items() if n}


class Paused:
    """SIGSTOPs a server process of ours for the block; SIGCONT on leaving, whatever happens
    (or earlier, with `resume()`)."""

    def __init__(self, server: RedisServer) -> None:
        assert server.process is not None
        self.pid = server.process.pid
        self.stopped = False

    def __enter__(self) -> Self:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True
        return self

    def resume(self) -> None:
        if self.stopped:
            os.kill(self.pid, signal.SIGCONT)
            self.stopped = False

    def __exit__(self, *exc: object) -> None:
        self.resume()
