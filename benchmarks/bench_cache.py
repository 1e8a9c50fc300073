"""Cache benchmarks: the stampede and the hit path, redmutex against its peers.

Starts its own redis-server (``redmutex._server.RedisServer``) and prints Markdown tables.

* Stampede: per round a cold key is asked for at once by 32 threads of this process (and, in
  the second scenario, by 8 other processes, one caller each), all released by one barrier; the
  fill takes 200 ms and counts itself with a Redis INCR. Reported: fills per round and the
  callers' latency (from the barrier to the value) p50/p99, over the 32 threads and over all
  callers. One warm-up round per library and scenario (connections, scripts) is not counted.
  Peers: dogpile.cache (redis backend, ``distributed_lock=True``) and python-redis-lock (the
  check / lock / re-check / fill recipe around ``redis_lock.Lock``).
* Hit path: cached reads per second of one small value (a dict of ~40 fields, pickled), from one
  thread and from 8 threads, against redis-py ``GET`` + ``pickle.loads`` (with hiredis when
  installed) and dogpile.cache's hit. Each rate is the best of many short interleaved runs, so
  that other load on the machine penalises every contender alike.

Usage: ``python benchmarks/bench_cache.py [--quick] [--rounds N] [--only redmutex,...]``.
A peer that is not installed is reported as such and skipped.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import pickle
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import redis
import redmutex
from redmutex._server import RedisServer

Caller = Callable[[str, Callable[[], Any]], Any]

THREADS = 32
PROCESSES = 8
FILL_S = 0.200
HIT_THREADS = 8
FORK = multiprocessing.get_context("fork")
VALUE = {f"field{i}": (i, "x" * 8) for i in range(40)}


# --------------------------------------------------------------------------------------------
# The contenders: each makes a `call(key, fill) -> value` for one process
# --------------------------------------------------------------------------------------------


def redmutex_caller(url: str) -> Caller:
    client = redmutex.Client(url, prefix="bench:")
    client.ping()

    def call(key: str, fill: Callable[[], Any]) -> Any:
        return redmutex.get_or_fill(client, key, fill, ttl=60, lock_ttl=10)

    return call


def dogpile_caller(url: str) -> Caller:
    from dogpile.cache import make_region

    region = make_region().configure(
        "dogpile.cache.redis",
        expiration_time=60,
        arguments={
            "url": url,
            "distributed_lock": True,
            "lock_timeout": 10,
            "redis_expiration_time": 120,
            "thread_local_lock": False,
        },
    )

    def call(key: str, fill: Callable[[], Any]) -> Any:
        return region.get_or_create(key, fill)

    return call


def redis_lock_caller(url: str) -> Caller:
    import redis_lock

    conn = redis.Redis.from_url(url)

    def call(key: str, fill: Callable[[], Any]) -> Any:
        raw = cast("bytes | None", conn.get(key))
        if raw is not None:
            return pickle.loads(raw)
        with redis_lock.Lock(conn, "lock:" + key, expire=10):
            raw = cast("bytes | None", conn.get(key))
            if raw is not None:
                return pickle.loads(raw)
            value = fill()
            conn.set(key, pickle.dumps(value), ex=60)
            return value

    return call


CONTENDERS: dict[str, tuple[str, Callable[[str], Caller]]] = {
    "redmutex": ("redmutex", redmutex_caller),
    "dogpile": ("dogpile.cache", dogpile_caller),
    "redis_lock": ("python-redis-lock", redis_lock_caller),
}


def version_of(name: str) -> str:
    if name == "redmutex":
        return str(redmutex.__version__)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version({"dogpile": "dogpile.cache", "redis_lock": "python-redis-lock"}[name])
    except PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------------------------
# Stampede
# --------------------------------------------------------------------------------------------


def _make_fill(conn: redis.Redis, counter: str) -> Callable[[], Any]:
    def fill() -> Any:
        n = conn.incr(counter)
        time.sleep(FILL_S)
        return {"fill": n, "pid": os.getpid(), "value": VALUE}

    return fill


def _one_call(call: Caller, key: str, fill: Callable[[], Any], barrier: Any) -> tuple[float, Any]:
    barrier.wait(timeout=60)
    started = time.perf_counter()
    value = call(key, fill)
    return time.perf_counter() - started, value["fill"]


def _stampede_worker(name: str, url: str, barrier: Any, commands: Any, results: Any) -> None:
    call = CONTENDERS[name][1](url)
    conn = redis.Redis.from_url(url)
    while True:
        key = commands.get()
        if key is None:
            return
        fill = _make_fill(conn, "fills:" + key)
        try:
            results.put(_one_call(call, key, fill, barrier))
        except Exception as exc:  # noqa: BLE001 - any failure is counted in the report
            results.put((float("nan"), repr(exc)))


def stampede(name: str, url: str, rounds: int, processes: int) -> dict[str, Any]:
    barrier = FORK.Barrier(THREADS + processes)
    results = FORK.Queue()
    queues = [FORK.Queue() for _ in range(processes)]
    workers = [
        FORK.Process(target=_stampede_worker, args=(name, url, barrier, q, results), daemon=True)
        for q in queues
    ]
    for w in workers:
        w.start()
    call = CONTENDERS[name][1](url)
    conn = redis.Redis.from_url(url)
    fills: list[int] = []
    thread_lat: list[float] = []
    all_lat: list[float] = []
    errors: list[str] = []
    try:
        for round_no in range(-1, rounds):  # round -1 warms up and is not counted
            key = f"{name}:stampede:{processes}:{round_no}:{time.time_ns()}"
            fill = _make_fill(conn, "fills:" + key)
            mine: list[tuple[float, Any]] = []

            def run(key: str = key, fill: Callable[[], Any] = fill, mine: list[Any] = mine) -> None:
                try:
                    outcome = _one_call(call, key, fill, barrier)
                except Exception as exc:  # noqa: BLE001 - any failure is counted in the report
                    outcome = (float("nan"), repr(exc))
                mine.append(outcome)  # list.append is atomic

            threads = [threading.Thread(target=run, daemon=True) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for q in queues:
                q.put(key)
            for t in threads:
                t.join(timeout=120)
            theirs = [results.get(timeout=120) for _ in range(processes)]
            if round_no < 0:
                continue
            fills.append(int(conn.get("fills:" + key) or 0))
            errors += [str(value) for lat, value in mine + theirs if math.isnan(lat)]
            thread_lat += [lat for lat, _ in mine if not math.isnan(lat)]
            all_lat += [lat for lat, _ in mine + theirs if not math.isnan(lat)]
    finally:
        for q in queues:
            q.put(None)
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
                w.join(timeout=5)
    return {
        "fills": fills,
        "threads": thread_lat,
        "all": all_lat,
        "errors": errors,
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


# --------------------------------------------------------------------------------------------
# Hit path
# --------------------------------------------------------------------------------------------


def _hit_readers(url: str) -> dict[str, Callable[[], Any]]:
    conn = redis.Redis.from_url(url)
    conn.set("raw:hit", pickle.dumps(VALUE))
    client = redmutex.Client(url, prefix="bench:")
    redmutex.get_or_fill(client, "hit", lambda: VALUE, ttl=3600)

    @redmutex.cached(client, ttl=3600, key="hit")
    def cached_hit() -> Any:
        return VALUE

    readers: dict[str, Callable[[], Any]] = {
        "redis-py GET + pickle.loads": lambda: pickle.loads(conn.get("raw:hit")),  # type: ignore[arg-type]
        "redmutex @cached": cached_hit,
        "redmutex get_or_fill": lambda: redmutex.get_or_fill(client, "hit", dict, ttl=3600),
    }
    try:
        dogpile = dogpile_caller(url)
        dogpile("hit", lambda: VALUE)
        readers["dogpile.cache get_or_create"] = lambda: dogpile("hit", dict)
    except ImportError:
        pass
    for read in readers.values():
        assert read() == VALUE
    return readers


def _rate(read: Callable[[], Any], threads: int, seconds: float) -> float:
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            for _ in range(50):
                read()
            n += 50
        counts[i] = n

    started = time.perf_counter()
    if threads == 1:
        loop(0)
    else:
        pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    return sum(counts) / (time.perf_counter() - started)


def hit_path(url: str, repeats: int, seconds: float) -> dict[tuple[str, int], float]:
    readers = _hit_readers(url)
    best: dict[tuple[str, int], float] = {}
    # All single-thread runs first: a multi-threaded run reshuffles where the kernel places this
    # process's threads and the server, and a single-thread ping-pong measured after it was
    # seen 2-3x slower for every contender alike, depending on which one ran last.
    for threads in (1, HIT_THREADS):
        for _ in range(repeats):
            for name, read in readers.items():
                rate = _rate(read, threads, seconds)
                best[name, threads] = max(best.get((name, threads), 0.0), rate)
    return best


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def conditions() -> str:
    load = os.getloadavg()
    server = "?"
    try:
        out = os.popen("redis-server --version").read().split()
        server = next((w.split("=")[1] for w in out if w.startswith("v=")), "?")
    except OSError:
        pass
    return (
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f}/{load[1]:.1f}, redis-server {server} on loopback, "
        f"redis-py {redis.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs")
    parser.add_argument("--rounds", type=int, default=None, help="stampede rounds per library")
    parser.add_argument("--only", default="", help="comma-separated: redmutex,dogpile,redis_lock")
    parser.add_argument("--no-hit", action="store_true", help="skip the hit-path benchmark")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    names = [n for n in (args.only.split(",") if args.only else CONTENDERS) if n]
    ok = True

    with RedisServer() as server:
        for processes in (0, PROCESSES):
            who = f"{THREADS} threads" + (f" + {processes} processes" if processes else "")
            print(f"## Cache stampede: {who}, fill {FILL_S * 1000:.0f} ms, {rounds} rounds\n")
            print(f"_{conditions()}_\n")
            print(
                "| library | version | fills per round | thread p50 | thread p99 | all p50 | all p99 |"
            )
            print("|---|---|---|---|---|---|---|")
            for name in names:
                label = CONTENDERS[name][0]
                version = version_of(name)
                if version == "not installed":
                    print(f"| {label} | not installed | | | | | |")
                    continue
                res = stampede(name, server.url, rounds, processes)
                fills = res["fills"]
                cells = [
                    f"{percentile(res[which], q) * 1000:.1f} ms"
                    for which in ("threads", "all")
                    for q in (50, 99)
                ]
                errors = f" ({len(res['errors'])} errors)" if res["errors"] else ""
                print(
                    f"| {label} | {version} | {statistics.mean(fills):.1f} (max {max(fills)})"
                    f"{errors} | {' | '.join(cells)} |"
                )
                sys.stdout.flush()
                if name == "redmutex":
                    ok &= max(fills) == 1 and not res["errors"]
                    if not processes:
                        ok &= percentile(res["threads"], 99) <= FILL_S + 0.005
            print()
        print(
            f"Done criterion: 1 fill per round; {THREADS}-thread p99 <= "
            f"{FILL_S * 1000 + 5:.0f} ms (the threads-only scenario)."
        )

        if not args.no_hit:
            # Many short interleaved windows: on a shared machine, the best of them is the
            # contender's own speed, the others being slowed by whatever else ran meanwhile.
            repeats, seconds = (4, 0.25) if args.quick else (12, 0.4)
            best = hit_path(server.url, repeats, seconds)
            print(
                f"\n## Cache hit path: reads/s (best of {repeats} interleaved runs of {seconds} s)\n"
            )
            print(f"_{conditions()}_\n")
            print(f"| reader | 1 thread | {HIT_THREADS} threads |")
            print("|---|---|---|")
            for name in dict.fromkeys(n for n, _ in best):
                print(f"| {name} | {best[name, 1]:,.0f} | {best[name, HIT_THREADS]:,.0f} |")
            base = best["redis-py GET + pickle.loads", 1]
            mine = best["redmutex @cached", 1]
            print(f"\n@cached / redis-py GET + unpickle, 1 thread: {mine / base:.2f}x")
            ok &= mine >= base
    print(f"\nDone criteria met: {'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
