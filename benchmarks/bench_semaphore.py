"""Semaphore and RWLock throughput, framed by the physical limit of one connection.

    .venv/bin/python benchmarks/bench_semaphore.py [--seconds S] [--quick] [--redis URL]

Starts a private redis-server (or uses --redis URL), measures the single-connection round-trip
rate with `redis-benchmark -c 1` (an acquire + release pair is two round trips, so it cannot beat
half of it), then runs each scenario for a fixed time and prints a Markdown table:

- Semaphore acquire+release pairs/s, uncontended (one process, limit 4);
- the same with 8 processes competing for a limit of 4 (fair and unfair);
- RWLock read acquire+release pairs/s in one process and across 8 processes;
- Lock acquire+release pairs/s, uncontended, for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

import redmutex
from redmutex._server import RedisServer

# One benchmark process: waits for the common start time, then runs pairs until the end time.
LOOP = r"""
import json, sys, time, redmutex
url, prefix, kind, limit, fair, start_at, seconds = sys.argv[1:8]
client = redmutex.Client(url, prefix=prefix)
if kind == "semaphore":
    obj = redmutex.Semaphore(client, "bench", int(limit), ttl=10, fair=fair == "1")
elif kind == "read":
    obj = redmutex.RWLock(client, "bench", ttl=10).read()
else:
    obj = redmutex.Lock(client, "bench", ttl=10)
assert obj.acquire(timeout=30)   # warm up: connections, subscription, scripts loaded
obj.release()
while time.monotonic() < float(start_at):
    time.sleep(0.001)
end = float(start_at) + float(seconds)
pairs = 0
slowest = 0.0
while True:
    t0 = time.monotonic()
    if t0 >= end:
        break
    if not obj.acquire(timeout=30):
        raise SystemExit("acquire timed out")
    obj.release()
    slowest = max(slowest, time.monotonic() - t0)
    pairs += 1
print(json.dumps({"pairs": pairs, "elapsed": time.monotonic() - float(start_at),
                  "slowest": slowest}), flush=True)
client.close()
"""


@dataclass
class Row:
    scenario: str
    processes: int
    pairs_per_s: float
    mean_us: float
    slowest_ms: float


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_loop(
    url: str, kind: str, processes: int, seconds: float, *, limit: int = 4, fair: bool = True
) -> Row:
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    start_at = time.monotonic() + 2.0 + 0.2 * processes  # CLOCK_MONOTONIC is host-wide
    args = [url, prefix, kind, str(limit), "1" if fair else "0", repr(start_at), str(seconds)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", LOOP, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(processes)
    ]
    results = []
    try:
        for child in children:
            out, err = child.communicate(timeout=seconds + 120)
            if child.returncode != 0:
                raise RuntimeError(f"{kind} benchmark process failed: {err.strip()[-500:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate(timeout=10)
    pairs = sum(r["pairs"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    rate = pairs / elapsed
    # each process runs its pairs one after another: mean time of one pair in one process
    mean_us = 1e6 * processes / rate if rate else float("inf")
    slowest = max(r["slowest"] for r in results) * 1000
    return Row("", processes, rate, mean_us, slowest)


def round_trip_limit(port: int, requests: int) -> float | None:
    """PING round trips per second over one connection (redis-benchmark -c 1), if available."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    out = subprocess.run(
        [binary, "-p", str(port), "-c", "1", "-n", str(requests), "-t", "ping_mbulk", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else None


def table(rows: list[Row], limit_rps: float | None) -> str:
    lines = [
        "| scenario | processes | pairs/s | mean µs per pair (per process) | slowest pair ms |",
        "|---|---:|---:|---:|---:|",
    ]
    if limit_rps is not None:
        lines.append(
            f"| physical limit: redis-benchmark -c 1 PING / 2 | 1 | {limit_rps / 2:,.0f} "
            f"| {2e6 / limit_rps:,.0f} | |"
        )
    for row in rows:
        lines.append(
            f"| {row.scenario} | {row.processes} | {row.pairs_per_s:,.0f} | "
            f"{row.mean_us:,.0f} | {row.slowest_ms:,.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per scenario")
    parser.add_argument("--quick", action="store_true", help="1 s per scenario")
    parser.add_argument("--redis", metavar="URL", help="use this server instead of a private one")
    opts = parser.parse_args(argv)
    seconds = 1.0 if opts.quick else opts.seconds

    server = None
    if opts.redis:
        url = opts.redis
        port = urlsplit(url).port or 6379
    else:
        server = RedisServer().start()
        url, port = server.url, server.port
    try:
        log(f"redmutex {redmutex.__version__} on {url}")
        before = round_trip_limit(port, 20_000 if opts.quick else 100_000)
        scenarios: list[tuple[str, str, int, dict[str, object]]] = [
            ("Semaphore acquire+release, uncontended (limit 4)", "semaphore", 1, {}),
            ("Semaphore, 8 processes on limit 4, fair", "semaphore", 8, {}),
            ("Semaphore, 8 processes on limit 4, unfair", "semaphore", 8, {"fair": False}),
            ("RWLock read acquire+release, 1 process", "read", 1, {}),
            ("RWLock read acquire+release, 8 processes", "read", 8, {}),
            ("Lock acquire+release, uncontended (reference)", "lock", 1, {}),
        ]
        rows = []
        for title, kind, processes, extra in scenarios:
            log(f"running: {title}")
            row = run_loop(url, kind, processes, seconds, **extra)  # type: ignore[arg-type]
            row.scenario = title
            rows.append(row)
        after = round_trip_limit(port, 20_000 if opts.quick else 100_000)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)

    limits = [x for x in (before, after) if x is not None]
    limit_rps = max(limits) if limits else None
    print(
        f"Conditions: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, loopback redis-server, "
        f"{seconds:g} s per scenario; redis-benchmark -c 1 PING: "
        + ", ".join(f"{x:,.0f}/s" for x in limits)
        + " (before, after)\n"
    )
    print(table(rows, limit_rps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
