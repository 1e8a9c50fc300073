"""The cache demo: many workers, threads and processes, ask for one slow resource at once.

``cache_demo(url)`` prints what happened and returns an exit status (0 when the resource was
computed exactly once and every worker got the same value), for ``python -m redmutex demo``.
It uses a fresh key prefix per run and drops its entry at the end, so it can run against any
server; the fill counts itself in shared memory, so redis-py is not needed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from typing import Any

from redmutex._cache import get_or_fill
from redmutex._core import CacheStore, Client

__all__ = ["cache_demo"]

_KEY = "slow-report"


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _worker(url: str, prefix: str, fill_s: float, fills: Any, start: Any, out: Any) -> None:
    """One worker: wait for the start signal, ask for the report, tell what it got and when."""
    client = Client(url, prefix=prefix)
    client.ping()  # connected before the start, so that the race is about the cache alone
    name = f"pid {os.getpid()}" + (
        f" thread {threading.get_ident() % 10_000}"
        if threading.current_thread() is not threading.main_thread()
        else ""
    )

    def compute_report() -> dict[str, Any]:
        with fills.get_lock():
            fills.value += 1
        time.sleep(fill_s)  # the slow part: a query, a remote call...
        return {"computed_by": name, "at": time.time(), "rows": 1234}

    start.wait(60)
    asked = time.monotonic()
    try:
        report = get_or_fill(client, _KEY, compute_report, ttl=60, lock_ttl=10, timeout=30)
        out.put((name, report["computed_by"], time.monotonic() - asked, None))
    except Exception as exc:  # noqa: BLE001 - shown to the user, and fails the demo
        out.put((name, None, time.monotonic() - asked, repr(exc)))


def cache_demo(
    url: str, *, threads: int = 16, processes: int = 4, fill_seconds: float = 0.5
) -> int:
    """Runs the stampede scenario against the server at ``url``; 0 when exactly one fill ran."""
    ctx = _context()
    prefix = f"redmutex-demo:{uuid.uuid4().hex[:12]}:"
    fills = ctx.Value("i", 0)
    start = ctx.Event()
    out = ctx.Queue()
    workers = threads + processes
    print(
        f"Cache stampede: {threads} threads and {processes} processes ask for one slow report "
        f"(computing it takes {fill_seconds:.1f} s) at the same moment."
    )
    procs = [
        ctx.Process(target=_worker, args=(url, prefix, fill_seconds, fills, start, out))
        for _ in range(processes)
    ]
    pool = [
        threading.Thread(
            target=_worker, args=(url, prefix, fill_seconds, fills, start, out), daemon=True
        )
        for _ in range(threads)
    ]
    results: list[tuple[str, str | None, float, str | None]] = []
    # An exception while starting them (Ctrl-C, a reader gone) joins only the ones started.
    started: list[Any] = []
    try:
        for proc in procs:
            proc.start()
            started.append(proc)
        for thread in pool:
            thread.start()
            started.append(thread)
        time.sleep(0.5)  # every worker connected and waiting for the start
        start.set()
        results = [out.get(timeout=90) for _ in range(workers)]
    finally:
        start.set()
        for thread in pool:
            if thread in started:
                thread.join(timeout=30)
        for proc in procs:
            if proc not in started:
                continue
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        try:
            CacheStore(Client(url, prefix=prefix), ttl=1).invalidate(_KEY)
        except Exception:  # noqa: BLE001, S110 - cleanup only; the entry expires anyway
            pass

    errors = [error for *_, error in results if error]
    computed_by = {by for _, by, _, error in results if not error}
    waits = sorted(waited for _, _, waited, error in results if not error)
    print(f"  fills: {fills.value}   (without the lock: one per worker, {workers})")
    if computed_by:
        print(f"  computed by: {', '.join(sorted(c for c in computed_by if c))}")
    if waits:
        print(
            f"  every worker got the same report: {'yes' if len(computed_by) == 1 else 'NO'}; "
            f"waits {waits[0]:.3f}-{waits[-1]:.3f} s (the fill itself takes {fill_seconds:.3f} s)"
        )
    for error in errors:
        print(f"  error: {error}")
    ok = fills.value == 1 and len(computed_by) == 1 and not errors and len(results) == workers
    print("  result: one fill, no stampede" if ok else "  result: FAILED")
    return 0 if ok else 1
