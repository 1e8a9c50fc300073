"""MultiLock against taking as many Locks one by one, in the same run.

    .venv/bin/python benchmarks/bench_multilock.py [--quick] [--seconds S] [--redis URL] [--json PATH]

Starts its own redis-server unless `--redis` names one, and prints a Markdown table.

* Uncontended: one thread takes and gives back 2 (then 5) names as fast as it can: a
  `MultiLock` over them (one round trip each way on one server) against that many `Lock`s
  acquired one by one in name order and released one by one (2k round trips). A "pair" is one
  acquire of every name plus its release: pairs/s, the best of several short runs, the two
  contenders interleaved so that other load on the machine penalises both alike.
* Contended (small): 4 processes, each looping over 2 of 3 shared names in crossing orders
  ([a, b], [b, c], [c, a], [b, a]), holding them 1 ms: pairs/s of all processes together, for
  the MultiLock and for Locks taken one by one in sorted name order (the usual way to avoid
  deadlock by hand; unsorted it could deadlock).

The load average of the machine is printed with the figures (the numbers move with it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redmutex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # the benchmarks directory is not a package
from redis_target import Target

FORK = multiprocessing.get_context("fork")
TTL = 10.0
HOLD_S = 0.001
CONTENDED_SETS = [["a", "b"], ["b", "c"], ["c", "a"], ["b", "a"]]

# (client, names) -> (acquire all, release all)
Pair = tuple[Callable[[], Any], Callable[[], Any]]
Maker = Callable[[redmutex.Client, list[str]], Pair]


def multi(client: redmutex.Client, names: list[str]) -> Pair:
    lock = redmutex.MultiLock(client, names, ttl=TTL)
    return lock.acquire, lock.release


def one_by_one(client: redmutex.Client, names: list[str]) -> Pair:
    locks = [redmutex.Lock(client, n, ttl=TTL) for n in sorted(names)]

    def acquire() -> None:
        for lock in locks:
            lock.acquire()

    def release() -> None:
        for lock in reversed(locks):
            lock.release()

    return acquire, release


CONTENDERS: dict[str, Maker] = {"MultiLock": multi, "Locks one by one": one_by_one}


def pairs_per_second(
    acquire: Callable[[], Any], release: Callable[[], Any], seconds: float
) -> float:
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        acquire()
        release()
        n += 1
        if n % 16 == 0 and time.perf_counter() >= deadline:
            break
    return n / (time.perf_counter() - t0)


def uncontended(url: str, k: int, seconds: float, rounds: int) -> dict[str, float]:
    client = redmutex.Client(url, prefix=f"bench-ml:{uuid.uuid4().hex[:6]}:")
    names = [f"u{k}-{i}" for i in range(k)]
    pairs = {label: make(client, names) for label, make in CONTENDERS.items()}
    for acquire, release in pairs.values():  # warm up connections and scripts
        pairs_per_second(acquire, release, 0.1)
    best = dict.fromkeys(pairs, 0.0)
    for _ in range(rounds):
        for label, (acquire, release) in pairs.items():
            best[label] = max(best[label], pairs_per_second(acquire, release, seconds))
    client.close()
    return best


def _contended_worker(
    url: str, prefix: str, label: str, names: list[str], seconds: float, start: Any, out: Any
) -> None:
    client = redmutex.Client(url, prefix=prefix)
    acquire, release = CONTENDERS[label](client, names)
    acquire()  # connections and scripts ready before the clock starts
    release()
    start.wait()
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        acquire()
        time.sleep(HOLD_S)
        release()
        n += 1
    out.put(n)


def contended(url: str, label: str, seconds: float) -> float:
    prefix = f"bench-ml:{uuid.uuid4().hex[:6]}:"
    start = FORK.Event()
    out = FORK.Queue()
    procs = [
        FORK.Process(target=_contended_worker, args=(url, prefix, label, s, seconds, start, out))
        for s in CONTENDED_SETS
    ]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every worker connected and warmed up
    start.set()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(30)
    return total / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--seconds", type=float, default=None, help="length of one run")
    parser.add_argument("--redis", default=None, help="Redis URL (default: a private server)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    rounds = 2 if args.quick else 4
    results: dict[str, Any] = {}
    with Target(args.redis) as target:
        with target.redis() as r:
            facts = machine.collect(r)
        for k in (2, 5):
            results[f"uncontended-{k}"] = uncontended(target.url, k, seconds, rounds)
        results["contended-4proc-2of3"] = {
            label: contended(target.url, label, seconds * 2) for label in CONTENDERS
        }
    facts["loadavg_end"] = machine.loadavg()
    print(f"# MultiLock vs Locks one by one ({machine.now_utc()})")
    print()
    print(
        f"{facts['nproc']} CPUs, load average {facts['loadavg_start']} at start, "
        f"{facts['loadavg_end']} at end; redis-server {facts['redis_server']}, {facts['python']}"
    )
    print()
    print("| scenario | MultiLock pairs/s | Locks one by one pairs/s | ratio |")
    print("|---|---:|---:|---:|")
    for scenario, figures in results.items():
        m, o = figures["MultiLock"], figures["Locks one by one"]
        print(f"| {scenario} | {m:,.0f} | {o:,.0f} | {m / o:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": facts, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
