"""asyncio benchmarks: redmutex.aio against redis-py's asyncio Lock in the same run.

Starts its own redis-server (``redmutex._server.RedisServer``) and prints Markdown tables.

* Uncontended: one task acquires and releases one name as fast as it can, in short windows taken
  in turn by the contenders (the order reversed every other cycle): pairs/s of the median
  window, and the ratio to redis-py as the median of each window ÷ redis-py's window of the same
  cycle, so that the machine's speed, which changes by 2x within minutes, falls on both sides of
  every ratio alike (the best windows of runs taken seconds apart once put one redis-py code
  path 1.36x ahead of itself); latency p50/p99 pooled over the windows.
* The asyncio round-trip limit, in the same windows: one task sends two PINGs, each awaited, on
  a bare ``asyncio.Protocol`` (nothing parsed, no pool, no script): the least two round trips
  cost an event loop's task, as the blocking-socket limit is for threads (``run.py``). Every
  uncontended row is also given as a ratio to it, same cycle.
* 8 tasks on 8 names in one event loop: pairs/s of all tasks together (one connection
  multiplexed for redmutex; redis-py's pool opens one per concurrent task).
* Hand-off: 2 and 4 processes, each running an event loop, loop acquire -> hold 1 ms -> release
  on one name. Hand-off latency is the time from just before the holder calls release() to the
  next holder's acquire() returning, for waiters that were already waiting. Never negative: the
  next holder can only have the lock after the release was sent (measured from release()
  returning, it was when the waiter had the lock before the releaser read its own reply).
  A peer that polls hands off rarely: the releaser takes the lock straight back, which shows in
  the owner switches and the longest wait.
* Cache stampede: 4 processes x 8 tasks ask for one cold key at once (released by a barrier);
  the fill takes 200 ms and counts itself. Fills per round and the callers' latency p50/p99.
  No peer: dogpile.cache has no asyncio API.

Peers: redis-py ``redis.asyncio.lock.Lock`` with its default ``sleep=0.1`` and with
``sleep=0.001``; redmutex unfair (default) and ``fair=True``.

Usage: ``python benchmarks/bench_aio.py [--quick] [--seconds S] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redmutex
from redmutex import aio
from redmutex._server import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contention  # the benchmarks directory is not a package

FORK = multiprocessing.get_context("fork")
TTL = 10.0
HOLD_S = 0.001
FILL_S = 0.200

# acquire and release of one lock object
Pair = tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]
# (url, name) -> a fresh lock's (acquire, release), made inside the running loop
Maker = Callable[[str, str], Pair]


def _redmutex(fair: bool) -> Maker:
    clients: dict[str, redmutex.Client] = {}

    def make(url: str, name: str) -> Pair:
        client = clients.get(url) or clients.setdefault(url, redmutex.Client(url, prefix="bench:"))
        lock = aio.Lock(client, name, ttl=TTL, fair=fair)
        return lock.acquire, lock.release

    return make


def _redis_py(sleep: float) -> Maker:
    conns: dict[tuple[str, int], redis.asyncio.Redis] = {}

    def make(url: str, name: str) -> Pair:
        # One client per event loop: redis.asyncio connections belong to the loop they opened in.
        key = (url, id(asyncio.get_running_loop()))
        conn = conns.get(key) or conns.setdefault(key, redis.asyncio.Redis.from_url(url))
        lock = conn.lock("bench:py:" + name, timeout=TTL, sleep=sleep)
        return lock.acquire, lock.release

    return make


class _PingProtocol(asyncio.Protocol):
    """One connection of the round-trip limit: writes a PING, resolves the waiter on its reply."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.pending += data
        if self.pending.endswith(b"\r\n") and self.waiter is not None and not self.waiter.done():
            self.pending = b""
            self.waiter.set_result(None)

    async def ping(self) -> None:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(b"*1\r\n$4\r\nPING\r\n")
        await self.waiter


def _round_trip_limit(url: str, name: str) -> Pair:
    """Two awaited PINGs on a bare protocol, opened on first use (see the module docstring)."""
    parsed = urlsplit(url)
    protocol: _PingProtocol | None = None

    async def ping() -> None:
        nonlocal protocol
        if protocol is None:
            loop = asyncio.get_running_loop()
            _, opened = await loop.create_connection(
                _PingProtocol, parsed.hostname or "127.0.0.1", parsed.port or 6379
            )
            protocol = opened
        await protocol.ping()

    return ping, ping


# The limit row of the uncontended table (not a contender: it takes no lock).
LIMIT = "asyncio round-trip limit (2 PINGs)"

CONTENDERS: dict[str, Maker] = {
    "redmutex.aio": _redmutex(fair=False),
    "redmutex.aio fair": _redmutex(fair=True),
    "redis-py asyncio": _redis_py(0.1),
    "redis-py asyncio sleep=1ms": _redis_py(0.001),
}
# What the ratios divide by.
REFERENCE = "redis-py asyncio"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# --------------------------------------------------------------------------------------------
# In one event loop
# --------------------------------------------------------------------------------------------


async def _pairs(pair: Pair, seconds: float, latencies: list[int] | None) -> int:
    acquire, release = pair
    n = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        started = time.perf_counter_ns()
        await acquire()
        await release()
        if latencies is not None:
            latencies.append(time.perf_counter_ns() - started)
        n += 1
    return n


async def _uncontended_windows(
    url: str, cycles: int, seconds: float
) -> dict[str, tuple[list[float], list[int]]]:
    """One task per contender on a name of its own, timed in short windows taken in turn: every
    cycle runs each contender's window once, the order reversed every other cycle, so that a
    change of the machine's speed falls on all of them alike. Each contender's window rates
    (one per cycle, in cycle order) and its pairs' latencies in ns."""
    makers: dict[str, Maker] = {**CONTENDERS, LIMIT: _round_trip_limit}
    pairs = {label: make(url, "u:" + label) for label, make in makers.items()}
    for pair in pairs.values():
        await _pairs(pair, 0.2, None)  # warm-up: connections, scripts
    found: dict[str, tuple[list[float], list[int]]] = {label: ([], []) for label in pairs}
    order = list(pairs)
    for cycle in range(cycles):
        for label in order if cycle % 2 == 0 else reversed(order):
            rates, latencies = found[label]
            started = time.perf_counter()
            n = await _pairs(pairs[label], seconds, latencies)
            rates.append(n / (time.perf_counter() - started))
    return found


def same_cycle_ratios(rates: list[float], base: list[float]) -> list[float]:
    """Each cycle's window rate ÷ the reference's window of the same cycle."""
    return [r / b for r, b in zip(rates, base, strict=True) if b > 0]


async def _tasks_on_names(make: Maker, url: str, tasks: int, seconds: float) -> float:
    pairs = [make(url, f"t{i}") for i in range(tasks)]
    await asyncio.gather(*(_pairs(p, min(seconds, 0.2), None) for p in pairs))
    started = time.perf_counter()
    counts = await asyncio.gather(*(_pairs(p, seconds, None) for p in pairs))
    return sum(counts) / (time.perf_counter() - started)


def in_loop(
    url: str, cycles: int, window: float, repeats: int, seconds: float
) -> list[dict[str, Any]]:
    """Uncontended: `cycles` interleaved windows of `window` s per contender (see
    `_uncontended_windows`); 8 tasks on 8 names: the best of `repeats` runs of `seconds`."""
    rows: dict[str, dict[str, Any]] = {}

    async def main() -> None:
        found = await _uncontended_windows(url, cycles, window)
        base = found[REFERENCE][0]
        limit = found[LIMIT][0]
        for label, (rates, latencies) in found.items():
            ratios = same_cycle_ratios(rates, base) or [math.nan]  # (no reference window)
            to_limit = same_cycle_ratios(rates, limit) or [math.nan]
            rows[label] = {
                "label": label,
                "pairs_per_s": statistics.median(rates),
                "best_pairs_per_s": max(rates),
                "p50_us": percentile([x / 1e3 for x in latencies], 50),
                "p99_us": percentile([x / 1e3 for x in latencies], 99),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "limit_ratio_median": statistics.median(to_limit),
                "windows": len(rates),
                "tasks8": 0.0,
            }
        for _ in range(repeats):
            for label, make in CONTENDERS.items():
                rate = await _tasks_on_names(make, url, 8, seconds)
                rows[label]["tasks8"] = max(rows[label]["tasks8"], rate)

    asyncio.run(main())
    return list(rows.values())


# --------------------------------------------------------------------------------------------
# Between processes
# --------------------------------------------------------------------------------------------


def _handoff_worker(label: str, url: str, index: int, barrier: Any, window: Any, out: Any) -> None:
    async def main() -> list[int]:
        acquire, release = CONTENDERS[label](url, "handoff")
        await acquire()  # warm-up: connections and scripts
        await release()
        barrier.wait(timeout=30)
        stop_ns = window["stop_ns"]
        rows: list[int] = []
        while time.perf_counter_ns() < stop_ns:
            acq_start = time.perf_counter_ns()
            await acquire()
            acq_end = time.perf_counter_ns()
            await asyncio.sleep(HOLD_S)
            rel_start = time.perf_counter_ns()
            await release()
            rows += (index, acq_start, acq_end, rel_start, time.perf_counter_ns())
        return rows

    out.put(contention.encode(asyncio.run(main())))


def handoff_latencies(sections: list[contention.Section], start_ns: int, end_ns: int) -> list[int]:
    """ns from just before the holder's release() call to the next holder's acquire()
    returning, where the next holder is another contender that was already waiting then and
    took over inside the window."""
    return [
        after.acq_end - before.rel_start
        for before, after in itertools.pairwise(sections)
        if after.owner != before.owner
        and after.acq_start <= before.rel_start
        and start_ns <= after.acq_end <= end_ns
    ]


def handoff(label: str, url: str, processes: int, seconds: float) -> dict[str, Any]:
    manager = FORK.Manager()
    try:
        window = manager.dict()
        barrier = FORK.Barrier(processes + 1)
        out = FORK.Queue()
        procs = [
            FORK.Process(target=_handoff_worker, args=(label, url, i, barrier, window, out))
            for i in range(processes)
        ]
        # The window opens shortly after everybody is ready and closes `seconds` later.
        for p in procs:
            p.start()
        start_ns = time.perf_counter_ns() + int(0.5e9)
        window["stop_ns"] = start_ns + int(seconds * 1e9) + int(0.3e9)
        barrier.wait(timeout=60)
        buffers = [out.get(timeout=60 + seconds) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        manager.shutdown()
    sections = contention.decode(buffers)
    start = sections[0].acq_end if sections else 0
    end = start + int(seconds * 1e9)
    lat = [x / 1e3 for x in handoff_latencies(sections, start, end)]
    summary = contention.contended_summary(sections, start, end, 1)
    return {
        "label": label,
        "processes": processes,
        "handoffs": len(lat),
        "p50_us": percentile(lat, 50),
        "p99_us": percentile(lat, 99),
        "owner_switch_pct": summary["owner_switch_pct"],
        "sections_per_s": summary["per_second"],
        "longest_wait_ms": summary["longest_wait_ms_max"],
        "max_holders": summary["max_holders_max"],
    }


def _stampede_worker(url: str, tasks: int, rounds: int, barrier: Any, out: Any) -> None:
    async def main() -> None:
        client = redmutex.Client(url, prefix="bench:")
        counter = redis.Redis.from_url(url)
        await aio.get_or_fill(client, "warm", lambda: 0, ttl=1)  # connections, scripts

        async def fill() -> int:
            n = int(counter.incr("bench:aio-fills"))
            await asyncio.sleep(FILL_S)
            return n

        async def call() -> tuple[float, Any]:
            started = time.monotonic()
            value = await aio.get_or_fill(client, "cold", fill, ttl=60)
            return time.monotonic() - started, value

        for _ in range(rounds):
            barrier.wait(timeout=30)  # the parent dropped the key: go
            out.put(await asyncio.gather(*(call() for _ in range(tasks))))
            barrier.wait(timeout=30)

    asyncio.run(main())


def stampede(url: str, processes: int, tasks: int, rounds: int) -> dict[str, Any]:
    conn = redis.Redis.from_url(url)
    barrier = FORK.Barrier(processes + 1)
    inbox = [FORK.Queue() for _ in range(processes)]
    procs = [
        FORK.Process(target=_stampede_worker, args=(url, tasks, rounds, barrier, q)) for q in inbox
    ]
    for p in procs:
        p.start()
    fills: list[int] = []
    latencies: list[float] = []
    for _ in range(rounds):
        conn.delete("bench:{cold}:value", "bench:aio-fills")
        barrier.wait(timeout=30)
        for q in inbox:
            latencies += [lat for lat, _ in q.get(timeout=60)]
        fills.append(int(conn.get("bench:aio-fills") or 0))
        barrier.wait(timeout=30)
    for p in procs:
        p.join(30)
    return {
        "processes": processes,
        "tasks": tasks,
        "fills": fills,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def conditions() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "redis_py": redis.__version__,
        "server": "redis-server on 127.0.0.1, no persistence",
    }


def report(result: dict[str, Any]) -> str:
    lines = ["## asyncio: redmutex.aio vs redis-py asyncio Lock", ""]
    lines += [f"_{json.dumps(result['conditions_start'])} -> load {result['load_end']}_", ""]
    rows = result["in_loop"]
    base8 = next((r["tasks8"] for r in rows if r["label"] == REFERENCE), math.nan)
    windows = rows[0]["windows"] if rows else 0
    lines += [
        (
            f"Uncontended, one task: {windows} windows per contender, taken in turn (the order "
            "reversed every other cycle); pairs/s is the median window, × redis-py the median "
            "of each window ÷ redis-py asyncio's window of the same cycle (min–max over the "
            "cycles); × limit likewise against the asyncio round-trip limit (two PINGs on a bare "
            "asyncio protocol, no lock); latencies pooled over the windows."
        ),
        "",
        (
            "| contender | uncontended pairs/s | best window | p50 µs | p99 µs | × redis-py, "
            "same cycle | × limit | 8 tasks on 8 names pairs/s | × redis-py |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        limit_row = r["label"] == LIMIT
        tasks8 = "—" if limit_row else f"{r['tasks8']:,.0f}"
        tasks8_ratio = "—" if limit_row else f"{r['tasks8'] / base8:.2f}"
        lines.append(
            f"| {r['label']} | {r['pairs_per_s']:,.0f} | {r['best_pairs_per_s']:,.0f} | "
            f"{r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['ratio_median']:.2f} "
            f"({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | {r['limit_ratio_median']:.2f} | "
            f"{tasks8} | {tasks8_ratio} |"
        )
    lines += [
        "",
        (
            f"Hand-off between processes (hold {HOLD_S * 1e3:.0f} ms, one name; from just "
            "before release() is called to the next holder's acquire() returning):"
        ),
        "",
        (
            "| contender | processes | hand-offs | p50 µs | p99 µs | owner switches % | "
            "sections/s | longest wait ms | holders |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in result["handoff"]:
        switches = "—" if h["owner_switch_pct"] is None else f"{h['owner_switch_pct']:.1f}"
        lines.append(
            f"| {h['label']} | {h['processes']} | {h['handoffs']} | {h['p50_us']:,.0f} | "
            f"{h['p99_us']:,.0f} | {switches} | {h['sections_per_s']:,.0f} | "
            f"{h['longest_wait_ms']:,.1f} | {h['max_holders']} |"
        )
    s = result["stampede"]
    lines += [
        "",
        (
            f"Cache stampede, aio.get_or_fill: {s['processes']} processes x {s['tasks']} tasks, "
            f"fill {FILL_S * 1e3:.0f} ms: fills per round {s['fills']}, latency p50 "
            f"{s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms."
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--seconds", type=float, help="length of one timed run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.3 if args.quick else 1.0)
    repeats = 2 if args.quick else 4
    cycles = 4 if args.quick else 12
    result: dict[str, Any] = {"conditions_start": conditions()}
    with RedisServer() as server:
        result["in_loop"] = in_loop(server.url, cycles, seconds / 4, repeats, seconds)
        result["handoff"] = [
            handoff(label, server.url, processes, seconds * 2)
            for processes in (2, 4)
            for label in CONTENDERS
        ]
        result["stampede"] = stampede(server.url, 4, 8, 2 if args.quick else 5)
    result["load_end"] = [round(x, 2) for x in os.getloadavg()]
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    bad = [h for h in result["handoff"] if h["max_holders"] > 1]
    ok = not bad and max(result["stampede"]["fills"]) == 1
    if not ok:
        print("\nFAILED: mutual exclusion or the single fill was violated", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
