"""The soak: a million acquire/release cycles; resident memory must stay flat and Redis clean.

    .venv/bin/python benchmarks/run.py --soak [--soak-cycles N] [--soak-threads T] [--redis URL]

THREADS threads share one `redmutex.Client` and NAMES lock names; each cycle makes a new `Lock`
object for a random name, acquires and releases it (the threads collide on names now and then,
so waiting and wake-ups are exercised, not only the fast path). The process's resident set size
is read from /proc/self/statm after a warm-up and then every SAMPLE_EVERY cycles; the report
gives the growth per 100k cycles. At the end every key under the run's prefix is listed: after
a release only the fencing counters (`...:fence`) may remain.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import machine
from redis_target import Target

CYCLES = 1_000_000
SAMPLE_EVERY = 100_000
THREADS = 4
NAMES = 16
WARMUP_CYCLES = 2_000
TTL = 10.0
FLAT_KIB_PER_100K = 64.0  # a fitted growth below this (under 0.7 byte per cycle) counts as flat


def rss_kib() -> int:
    """Resident set size of this process in KiB (Linux /proc/self/statm)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _slope(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of RSS (KiB) over cycles, in KiB per 100k cycles."""
    if len(points) < 2:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return cov / var * 100_000


def _chunks(cycles: int, every: int) -> list[int]:
    sizes = [every] * (cycles // every)
    if cycles % every:
        sizes.append(cycles % every)
    return sizes


def run(
    url: str, cycles: int, threads: int, log: Callable[[str], None], every: int = SAMPLE_EVERY
) -> dict[str, Any]:
    import redis
    import redmutex

    prefix = f"redmutex-soak-{uuid.uuid4().hex[:8]}:"
    client = redmutex.Client(url, prefix=prefix)
    errors: list[str] = []
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    try:

        def cycles_of(count: int, rng: random.Random) -> None:
            for _ in range(count):
                lock = redmutex.Lock(client, f"soak:{rng.randrange(NAMES)}", ttl=TTL, timeout=30)
                if not lock.acquire():
                    raise TimeoutError("acquire() gave up after 30 s")
                lock.release()

        def chunk(count: int, seed: int) -> None:
            share = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
            failures: list[BaseException] = []

            def body(i: int) -> None:
                try:
                    cycles_of(share[i], random.Random(seed * 1000 + i))
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    failures.append(exc)

            pool = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join(timeout=600)
            if failures:
                raise failures[0]
            if any(t.is_alive() for t in pool):
                raise TimeoutError("a soak thread did not finish a chunk within 600 s")

        chunk(WARMUP_CYCLES, 0)
        done = 0
        samples.append({"cycles": 0, "rss_kib": rss_kib(), "seconds": 0.0})
        log(f"soak: {cycles:,} cycles, {threads} threads, {NAMES} names; RSS {rss_kib():,} KiB")
        t0 = time.monotonic()
        for seed, count in enumerate(_chunks(cycles, every), start=1):
            chunk(count, seed)
            done += count
            sample = {
                "cycles": done,
                "rss_kib": rss_kib(),
                "seconds": round(time.monotonic() - t0, 2),
            }
            samples.append(sample)
            log(
                f"  {done:>9,} cycles  RSS {sample['rss_kib']:,} KiB"
                f"  ({done / max(sample['seconds'], 1e-9):,.0f} cycles/s)"
            )
    except Exception as exc:  # noqa: BLE001 - reported in the record
        errors.append(f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300])
    finally:
        client.close()

    conn = redis.Redis.from_url(url, socket_timeout=10)
    try:
        keys = sorted(k.decode("utf-8", "replace") for k in conn.scan_iter(match=prefix + "*"))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()
    leftover = [k for k in keys if not k.endswith(":fence")]
    if leftover:
        errors.append(f"{len(leftover)} key(s) other than fences left, e.g. {leftover[:3]}")

    growth = [
        {"from": a["cycles"], "to": b["cycles"], "kib": b["rss_kib"] - a["rss_kib"]}
        for a, b in itertools.pairwise(samples)
    ]
    fitted_over = [(s["cycles"], s["rss_kib"]) for s in samples[1:]]  # after the first chunk
    slope = _slope(fitted_over)
    last = samples[-1] if samples else {"cycles": 0, "seconds": 0.0}
    return {
        "prefix": prefix,
        "cycles": last["cycles"],
        "threads": threads,
        "names": NAMES,
        "sample_every": every,
        "seconds": round(time.monotonic() - started, 1),
        "cycles_per_second": (
            round(last["cycles"] / last["seconds"], 1) if last["seconds"] else None
        ),
        "samples": samples,
        "growth": growth,
        "growth_kib_per_100k_fitted": None if slope is None else round(slope, 1),
        "first_chunk_growth_kib": growth[0]["kib"] if growth else None,
        "flat": slope is not None and slope < FLAT_KIB_PER_100K,
        "keys_left": len(keys),
        "fence_keys_left": len(keys) - len(leftover),
        "other_keys_left": leftover[:20],
        "errors": errors,
    }


def markdown(record: dict[str, Any]) -> str:
    m, s = record["machine"], record["soak"]
    lines = [
        "# redmutex soak",
        "",
        f"- date: {record['date']}; took {s['seconds']:.0f} s",
        (
            f"- machine: nproc {m['nproc']}, {m['cpu_model'] or 'cpu model unknown'};"
            f" load average {m['loadavg_start']} at start, {m['loadavg_end']} at end;"
            f" Python {m['python']}, redis-server {m['redis_server']}"
        ),
        (
            f"- {s['cycles']:,} acquire/release cycles ({s['cycles_per_second'] or 0:,.0f}/s),"
            f" {s['threads']} threads on {s['names']} names, a new Lock object per cycle"
        ),
        "",
        "| cycles | RSS KiB | growth KiB | s |",
        "|---:|---:|---:|---:|",
    ]
    growth = {g["to"]: g["kib"] for g in s["growth"]}
    for sample in s["samples"]:
        lines.append(
            f"| {sample['cycles']:,} | {sample['rss_kib']:,} | {growth.get(sample['cycles'], '')}"
            f" | {sample['seconds']:.1f} |"
        )
    slope = s["growth_kib_per_100k_fitted"]
    lines += [
        "",
        (
            f"- RSS growth per 100k cycles (least squares over the samples from"
            f" {s['sample_every']:,} cycles on): "
            + ("—" if slope is None else f"{slope:,.1f} KiB")
            + f"; first chunk (warming allocators): {s['first_chunk_growth_kib']} KiB;"
            f" flat (< {FLAT_KIB_PER_100K:g} KiB per 100k): {'yes' if s['flat'] else 'no'}"
        ),
        (
            f"- Redis keys left under the prefix: {s['keys_left']}"
            f" ({s['fence_keys_left']} `:fence`, {len(s['other_keys_left'])} other)"
        ),
    ]
    if s["errors"]:
        lines += ["", "Errors:", *[f"- {e}" for e in s["errors"]]]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """`run.py --soak`: the soak alone, on a private redis-server or --redis URL."""
    cycles = args.soak_cycles or CYCLES
    every = SAMPLE_EVERY if cycles >= 2 * SAMPLE_EVERY else max(1_000, cycles // 10)
    record: dict[str, Any] = {"schema": 1, "date": machine.now_utc()}
    with Target(args.redis) as target:
        probe = target.redis()
        try:
            record["machine"] = machine.collect(probe)
        finally:
            probe.close()
        log(f"redis: {target.display_url} ({'private' if target.private else 'given'})")
        record["soak"] = run(target.url, cycles, args.soak_threads, log, every)
    record["machine"]["loadavg_end"] = machine.loadavg()
    text = markdown(record)
    print(text)
    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "soak.md").write_text(text)
    log(f"wrote {out / 'soak.json'} and {out / 'soak.md'}")
    return 1 if record["soak"]["errors"] else 0
