"""`python -m redmutex demo`: the book's money transfer, run from several processes at once.

After it, the same server shows two more scenarios: a fair lock handing over in arrival order
across processes (`fair`) and a semaphore limiting calls to a slow resource
(`semaphore`). The exit code is 0 only if every scenario's invariant held.

Five accounts start with the same balance. Several processes (started with "spawn", so each has
its own interpreter, connections and locks) make random transfers with `transfer_funds`, exactly
as in the API page: the sender's balance is checked and debited under `redis_lock(conn, "lock:" +
sender)`. Without the lock, two processes could both see enough money and overdraw an account;
with it, the total is conserved and no balance ever goes negative, which the demo checks.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import random
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from redmutex import redis_lock
from redmutex._core import _redact_text
from redmutex._demos.connect import redis_py_client, server_settings

if TYPE_CHECKING:
    import redis

ACCOUNTS = ("alice", "bob", "carol", "dave", "erin")
INITIAL_BALANCE = 100
MAX_AMOUNT = 40  # large against the balances, so transfers often find too little money
START_TIMEOUT = 120.0  # seconds for the worker processes to start
RUN_TIMEOUT = 300.0  # seconds for all transfers
# How often the wait for the workers' results looks whether a SIGTERM or SIGHUP came.
_LOOK_EVERY = 0.25
# The signal that ended the demo, once one came (see `_cleaned_up_on_termination`).
_terminated: list[int] = []


class DemoError(Exception):
    """The demo could not run (as opposed to: it ran and the invariant broke)."""


def transfer_funds(conn: redis.Redis, sender: str, recipient: str, amount: int) -> bool:
    with redis_lock(conn, "lock:" + sender):
        if int(conn.hget(sender, "money") or 0) < amount:
            return False
        pipe = conn.pipeline(True)
        pipe.hincrby(sender, "money", -amount)
        pipe.hincrby(recipient, "money", amount)
        pipe.execute()
        return True


def _audited_connection(url: str) -> Any:
    """A redis-py client that counts transactions leaving a balance below zero.

    `transfer_funds` stays exactly as written; its MULTI/EXEC replies are the new balances, so
    every overdraft is seen at the moment it happens, even if later deposits hide it.
    """
    import redis

    class AuditedRedis(redis.Redis):
        overdrafts = 0

        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            pipe: Any = super().pipeline(transaction, shard_hint)
            execute = pipe.execute

            def audited_execute(raise_on_error: bool = True) -> list[Any]:
                replies: list[Any] = execute(raise_on_error)
                if any(type(r) is int and r < 0 for r in replies):
                    self.overdrafts += 1
                return replies

            pipe.execute = audited_execute
            return pipe

    return redis_py_client(AuditedRedis, url, socket_timeout=30)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _worker(
    url: str, accounts: list[str], transfers: int, seed: int, barrier: Any, results: Any
) -> None:
    """One process: wait for the start signal, make `transfers` random transfers, report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = None
    try:
        conn = _audited_connection(url)
        rng = random.Random(seed)
        barrier.wait(timeout=START_TIMEOUT)
        done = refused = 0
        for _ in range(transfers):
            sender, recipient = rng.sample(accounts, 2)
            if transfer_funds(conn, sender, recipient, rng.randint(1, MAX_AMOUNT)):
                done += 1
            else:
                refused += 1
        results.put(("ok", os.getpid(), done, refused, conn.overdrafts))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        results.put(("error", os.getpid(), _redact_text(_one_line(exc), [url]), 0, 0))
    finally:
        if conn is not None:
            conn.close()


@dataclass
class Outcome:
    initial: dict[str, int]
    final: dict[str, int]
    seconds: float
    done: int = 0
    refused: int = 0
    overdrafts: int = 0  # transfers that left the sender below zero, seen as they happened
    failures: list[str] = field(default_factory=list)

    @property
    def conserved(self) -> bool:
        return sum(self.initial.values()) == sum(self.final.values())

    @property
    def negative(self) -> dict[str, int]:
        return {name: value for name, value in self.final.items() if value < 0}


def _balances(conn: redis.Redis, keys: list[str]) -> dict[str, int]:
    pipe = conn.pipeline(False)
    for key in keys:
        pipe.hget(key, "money")
    return {name: int(value or 0) for name, value in zip(ACCOUNTS, pipe.execute())}


def _delete_namespace(conn: redis.Redis, namespace: str) -> None:
    """Best effort: the accounts and their locks' fencing counters (the server may be gone)."""
    import redis

    try:
        for key in conn.scan_iter(match=f"*{namespace}*", count=1000):
            conn.delete(key)
    except redis.RedisError:
        pass


def _where(conn: redis.Redis) -> str:
    """Where the server is, without user name or password."""
    kwargs = conn.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix socket {kwargs['path']}, db {kwargs.get('db', 0)}"
    return f"{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}, db {kwargs.get('db', 0)}"


def _transfer_from_processes(
    url: str, keys: list[str], processes: int, transfers: int
) -> tuple[float, list[tuple[Any, ...]]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    seeds = random.SystemRandom()
    workers = [
        ctx.Process(
            target=_worker,
            args=(url, keys, transfers, seeds.getrandbits(64), barrier, results),
            name=f"redmutex-demo-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    started = []  # an exception while starting them (Ctrl-C, a reader gone) joins these only
    try:
        for worker in workers:
            worker.start()
            started.append(worker)
        try:
            barrier.wait(timeout=START_TIMEOUT)
        except Exception:  # noqa: BLE001 - a broken barrier means a worker died early
            barrier.abort()
            replies = _drain(results, len(workers), deadline=time.monotonic() + 5)
            errors = [r[2] for r in replies if r[0] == "error"]
            raise DemoError(
                "worker processes did not start: " + (errors[0] if errors else "timed out")
            ) from None
        start = time.perf_counter()
        replies = _drain(results, len(workers), deadline=time.monotonic() + RUN_TIMEOUT)
        seconds = time.perf_counter() - start
        if len(replies) < len(workers):
            raise DemoError(f"the transfers did not finish within {RUN_TIMEOUT:.0f} s")
        return seconds, replies
    finally:
        # Interrupted (Ctrl-C, which the workers leave to us) before the start: the workers
        # stop waiting for it now, not after START_TIMEOUT. (Harmless once they all started.)
        barrier.abort()
        for worker in started:  # only the processes started here, each by its own handle
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        results.close()


def _drain(results: Any, count: int, deadline: float) -> list[tuple[Any, ...]]:
    replies: list[tuple[Any, ...]] = []
    while len(replies) < count:
        _end_if_terminated()
        left = deadline - time.monotonic()
        try:
            replies.append(results.get(timeout=max(0.0, min(left, _LOOK_EVERY))))
        except queue.Empty:
            if left <= _LOOK_EVERY:
                break
    return replies


def _end_if_terminated() -> None:
    """Ends the demo if a SIGTERM or SIGHUP came whose SystemExit Python dropped: raised while
    the main thread ran a callback (an import's module-lock weakref callback, say), it is only
    printed ("Exception ignored in ..."), and the demo would run on for minutes."""
    if _terminated:
        raise SystemExit(128 + _terminated[0])


def run_demo(url: str, processes: int, transfers: int, out: TextIO, label: str) -> Outcome:
    try:
        import redis
    except ImportError:
        raise DemoError("the demo needs redis-py: pip install 'redmutex[redis]'") from None
    conn = redis_py_client(redis.Redis, url, socket_timeout=10)
    try:
        try:
            conn.ping()
        except redis.RedisError as exc:
            raise DemoError(f"cannot use Redis at {_where(conn)}: {_one_line(exc)}") from None
        version = conn.info("server").get("redis_version", "?")
        namespace = f"redmutex-demo:{uuid.uuid4().hex[:12]}"
        keys = [f"{namespace}:{name}" for name in ACCOUNTS]
        pipe = conn.pipeline(True)
        for key in keys:
            pipe.hset(key, "money", INITIAL_BALANCE)
        pipe.execute()
        print(
            f"redmutex demo: {processes} processes x {transfers} random transfers"
            f" among {len(ACCOUNTS)} accounts",
            file=out,
        )
        print(f"redis-server {version} at {_where(conn)} ({label})", file=out)
        initial = _balances(conn, keys)
        try:
            seconds, replies = _transfer_from_processes(url, keys, processes, transfers)
            outcome = Outcome(initial, _balances(conn, keys), seconds)
        finally:
            _delete_namespace(conn, namespace)
    finally:
        conn.close()
    for reply in replies:
        if reply[0] == "ok":
            outcome.done += reply[2]
            outcome.refused += reply[3]
            outcome.overdrafts += reply[4]
        else:
            outcome.failures.append(f"process {reply[1]}: {reply[2]}")
    return outcome


def _row(title: str, balances: dict[str, int]) -> str:
    cells = "  ".join(f"{name} {value:>4}" for name, value in balances.items())
    return f"{title:<8} {cells}   total {sum(balances.values())}"


def report(outcome: Outcome, out: TextIO) -> bool:
    """Prints the result; True when the invariant held."""
    print(_row("initial", outcome.initial), file=out)
    print(_row("final", outcome.final), file=out)
    total = outcome.done + outcome.refused
    rate = total / outcome.seconds if outcome.seconds > 0 else 0.0
    print(
        f"{total} transfers in {outcome.seconds:.2f} s ({rate:,.0f}/s):"
        f" {outcome.done} done, {outcome.refused} refused for lack of funds",
        file=out,
    )
    ok = outcome.conserved and not outcome.negative and not outcome.overdrafts
    if ok and outcome.failures:
        return ok  # no "OK" for a partial run: the caller reports the failure
    if ok:
        print(
            "OK: the total is conserved and no balance went negative"
            " (checked after every transfer)",
            file=out,
        )
    else:
        problems = []
        if not outcome.conserved:
            before, after = sum(outcome.initial.values()), sum(outcome.final.values())
            problems.append(f"the total changed from {before} to {after}")
        if outcome.negative:
            shown = ", ".join(f"{k} {v}" for k, v in outcome.negative.items())
            problems.append(f"negative balance at the end: {shown}")
        if outcome.overdrafts:
            problems.append(f"{outcome.overdrafts} transfer(s) overdrew the sender")
        if outcome.failures:
            problems.append(f"{len(outcome.failures)} worker(s) failed: {outcome.failures[0]}")
        print("FAILED: " + "; ".join(problems), file=out)
    return ok


def _run_all(url: str, processes: int, transfers: int, out: TextIO, label: str) -> int:
    """The money transfer, a fair hand-off between processes, the semaphore, the cache."""
    from redmutex._demos.cache import cache_demo
    from redmutex._demos.fair import fair_demo
    from redmutex._demos.semaphore import semaphore_demo

    outcome = run_demo(url, processes, transfers, out, label)
    ok = report(outcome, out)
    if outcome.failures and ok:
        raise DemoError(f"{len(outcome.failures)} worker(s) failed, first: {outcome.failures[0]}")
    print(file=out)
    fair_ok = fair_demo(url, out=out) == 0
    print(file=out)
    out.flush()
    semaphore_ok = semaphore_demo(url) == 0  # prints to stdout
    print(file=out)
    out.flush()
    cache_ok = cache_demo(url) == 0  # prints to stdout
    return 0 if ok and fair_ok and semaphore_ok and cache_ok else 1


def main(
    url: str | None, processes: int = 6, transfers: int = 300, out: TextIO = sys.stdout
) -> int:
    """Runs the demo; 0 when every invariant held, 1 when one broke. Raises DemoError otherwise."""
    label = "from --redis"
    if url is None:
        url, label = os.environ.get("REDIS_URL") or None, "from REDIS_URL"
    if url is not None:
        try:
            server_settings(url)
        except ValueError as exc:
            raise DemoError(str(exc)) from None
    with _cleaned_up_on_termination():
        if url is not None:
            return _run_all(url, processes, transfers, out, label)
        from redmutex._server import RedisServer

        server = RedisServer()
        try:
            try:
                server.start()
            except RuntimeError as exc:
                raise DemoError(f"cannot start a private redis-server: {exc}") from None
            return _run_all(server.url, processes, transfers, out, "private, for this demo")
        finally:
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)


@contextlib.contextmanager
def _cleaned_up_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP (`kill`, `timeout`, a closed terminal) end the demo as Ctrl-C does,
    through its cleanup: its worker processes and its private redis-server (in a session of its
    own, which those signals do not reach) are stopped, rather than left running."""

    def leave(signum: int, _frame: Any) -> None:
        _terminated.append(signum)
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        _terminated.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
