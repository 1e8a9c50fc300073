"""Scale-out benchmark: uncontended acquire+release pairs per second on a Redis Cluster and on
3- and 5-master Redlock, next to pottery's Redlock on the very same masters.

Standalone: it starts its own redis-servers on loopback (a 3-master cluster made with
`redis-cli --cluster create`, 5 independent masters, and one plain server for reference) and
stops them, by PID, when done.

    python benchmarks/bench_scale.py [--seconds 3] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redmutex
from redmutex._server import FREE_PORT, RedisServer


def pairs_per_second(pair: Callable[[], None], seconds: float) -> float:
    """Runs `pair` back to back for `seconds` (after a short warm-up); pairs per second."""
    warm_until = time.perf_counter() + min(0.3, seconds / 5)
    while time.perf_counter() < warm_until:
        pair()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            pair()
        count += 20
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - start)


def redmutex_pair(client: redmutex.Client, name: str) -> Callable[[], None]:
    lock = redmutex.Lock(client, name, ttl=10)

    def pair() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended acquire failed")
        lock.release()

    return pair


def pottery_pair(masters: list[redis.Redis], name: str) -> Callable[[], None] | None:
    try:
        from pottery import Redlock
    except ImportError:
        return None
    lock = Redlock(key=name, masters=set(masters), auto_release_time=10)

    def pair() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended pottery acquire failed")
        lock.release()

    return pair


def primitive_pairs(client: redmutex.Client, name: str) -> dict[str, Callable[[], None]]:
    """Uncontended acquire+release pairs of every leased primitive besides the Lock, and cache
    calls (a miss that fills, and a hit)."""
    sem = redmutex.Semaphore(client, name + ":sem", 5, ttl=10, fair=False)
    rw = redmutex.RWLock(client, name + ":rw", ttl=10)
    reader, writer = rw.read(), rw.write()

    def pair_of(hold: Any) -> Callable[[], None]:
        def pair() -> None:
            if not hold.acquire(blocking=False):
                raise RuntimeError("an uncontended acquire failed")
            hold.release()

        return pair

    counter = iter(range(10**12))

    def fill() -> None:
        # A miss each time: a fresh key is claimed, filled and stored.
        key = f"{name}:fill:{next(counter)}"
        redmutex.get_or_fill(client, key, lambda: b"x" * 100, ttl=60, serializer="pickle")

    redmutex.get_or_fill(client, name + ":hot", lambda: b"x" * 100, ttl=600)

    def hit() -> None:
        redmutex.get_or_fill(client, name + ":hot", lambda: b"never", ttl=600)

    return {
        "Semaphore(5)": pair_of(sem),
        "RWLock read": pair_of(reader),
        "RWLock write": pair_of(writer),
        "cache fill (miss, claim, store; calls/s)": fill,
        "cache hit (calls/s)": hit,
    }


def primitive_rows(
    single: RedisServer, cluster: list[RedisServer], masters: list[RedisServer], seconds: float
) -> list[dict[str, Any]]:
    """Semaphore, RWLock and cache rows on a single server, a 3-master Cluster and 3- and
    5-master Redlock. pottery 3.0 has no counterpart on Redlock (its `Redlock` is a mutex; it has no semaphore
    or read-write lock, and its `redis_cache` is a plain single-server cache without stampede
    protection), so it has no row here."""
    rows: list[dict[str, Any]] = []
    setups = {
        "single server (reference)": redmutex.Client(single.url),
        "Redis Cluster, 3 masters": redmutex.Client(cluster=[s.url for s in cluster]),
        "Redlock, 3 masters": redmutex.Client([m.url for m in masters[:3]]),
        "Redlock, 5 masters": redmutex.Client([m.url for m in masters]),
    }
    for label, client in setups.items():
        for primitive, pair in primitive_pairs(client, "bench:prim:" + label).items():
            rate = pairs_per_second(pair, seconds)
            rows.append({"setup": label, "library": f"redmutex {primitive}", "pairs_per_s": rate})
    return rows


def round_trips_per_second(port: int, requests: int) -> float | None:
    """`redis-benchmark -c 1` PING rate: the single-connection round-trip limit."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    out = subprocess.run(
        [binary, "-p", str(port), "-c", "1", "-n", str(requests), "-t", "ping_mbulk", "-q"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for token in out.replace("\r", "\n").split():
        try:
            return float(token)
        except ValueError:
            continue
    return None


def start_cluster(size: int) -> list[RedisServer]:
    servers = [
        RedisServer(
            extra_args=[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                FREE_PORT,
            ]
        )
        for _ in range(size)
    ]
    for server in servers:
        server.start()
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is not installed")
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    subprocess.run(
        [cli, "--cluster", "create", *addresses, "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = []
        for s in servers:
            with redis.Redis(port=s.port) as r:
                states.append(b"cluster_state:ok" in r.execute_command("CLUSTER", "INFO"))
        if all(states):
            return servers
        time.sleep(0.1)
    raise RuntimeError("the cluster did not settle")


def start_sentinel() -> tuple[list[RedisServer], str]:
    """One master, one replica and one sentinel (service 'bench'); the URL to reach it."""
    import os
    import tempfile

    master = RedisServer().start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    servers = [master, replica]
    conf = os.path.join(tempfile.mkdtemp(prefix="redmutex-bench-sentinel-"), "sentinel.conf")
    with open(conf, "w") as f:
        f.write(f"sentinel monitor bench 127.0.0.1 {master.port} 1\n")
    sentinel = RedisServer(config_file=conf, extra_args=["--sentinel"])
    servers.append(sentinel.start())
    return servers, f"redis+sentinel://127.0.0.1:{sentinel.port}/bench"


def fast_path_rows(
    single: RedisServer, cluster: list[RedisServer], seconds: float
) -> list[dict[str, Any]]:
    """Uncontended pairs/s on one server, a 3-master cluster and a Sentinel-managed master, in
    many short interleaved rounds (the machine's load moves; each setup meets the same): the
    median rate per setup, the median of each round's ratio to the single server's rate in the
    same round, and the client's CPU time per pair (which the load moves much less)."""
    import os
    import statistics

    servers, sentinel_url = start_sentinel()
    try:
        clients = {
            "single server": redmutex.Client(single.url),
            "Redis Cluster, 3 masters": redmutex.Client(cluster=[s.url for s in cluster]),
            "Sentinel, master + replica": redmutex.Client(sentinel_url),
        }
        pairs = {label: redmutex_pair(c, "bench:fast:" + label) for label, c in clients.items()}
        rates: dict[str, list[float]] = {label: [] for label in pairs}
        cpu: dict[str, list[float]] = {label: [] for label in pairs}
        load_before = os.getloadavg()[0]
        rounds = max(5, round(seconds * 4))
        for _ in range(rounds):
            for label, pair in pairs.items():
                used = time.process_time()
                rate = pairs_per_second(pair, seconds / rounds)
                used = time.process_time() - used
                rates[label].append(rate)
                # The measured pairs and the warm-up's, over the time both took.
                cpu[label].append(
                    used / (rate * (seconds / rounds + min(0.3, seconds / rounds / 5)))
                )
        load_after = os.getloadavg()[0]
    finally:
        for server in servers:
            server.stop()
    reference = rates["single server"]
    return [
        {
            "setup": f"{label} (fast path, interleaved)",
            "library": "redmutex",
            "pairs_per_s": statistics.median(found),
            "vs_single": statistics.median(r / ref for r, ref in zip(found, reference)),
            "cpu_us_per_pair": statistics.median(cpu[label]) * 1e6,
            "load_1min": (load_before + load_after) / 2,
        }
        for label, found in rates.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    parser.add_argument("--quick", action="store_true", help="1 s per row")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else args.seconds

    single = RedisServer().start()
    masters = [RedisServer().start() for _ in range(5)]
    cluster: list[RedisServer] = []
    rows: list[dict[str, Any]] = []
    try:
        cluster = start_cluster(3)
        rtt = round_trips_per_second(single.port, 20_000 if args.quick else 100_000)
        clients = {
            "single server (reference)": redmutex.Client(single.url),
            "Redis Cluster, 3 masters": redmutex.Client(cluster=[s.url for s in cluster]),
            "Redlock, 3 masters": redmutex.Client([m.url for m in masters[:3]]),
            "Redlock, 5 masters": redmutex.Client([m.url for m in masters]),
        }
        for label, client in clients.items():
            rate = pairs_per_second(redmutex_pair(client, "bench:" + label), seconds)
            rows.append({"setup": label, "library": "redmutex", "pairs_per_s": rate})
        for n in (3, 5):
            conns = [redis.Redis(port=m.port) for m in masters[:n]]
            pair = pottery_pair(conns, f"bench:pottery:{n}")
            if pair is None:
                rows.append(
                    {"setup": f"Redlock, {n} masters", "library": "pottery", "pairs_per_s": None}
                )
                continue
            rate = pairs_per_second(pair, seconds)
            rows.append(
                {"setup": f"Redlock, {n} masters", "library": "pottery", "pairs_per_s": rate}
            )
            for c in conns:
                c.close()
        rows += primitive_rows(single, cluster, masters, seconds)
        rows.extend(fast_path_rows(single, cluster, seconds))
    finally:
        for server in [single, *masters, *cluster]:
            server.stop()

    conditions = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "seconds_per_row": seconds,
        "servers": "redis-server on 127.0.0.1, no persistence, one client thread, uncontended",
        "redis_benchmark_c1_ping_per_s": rtt,
    }
    if args.json:
        json.dump({"conditions": conditions, "rows": rows}, sys.stdout, indent=2)
        print()
        return
    print(f"# Scale-out benchmark ({seconds:g} s per row, uncontended acquire+release pairs)")
    for key, value in conditions.items():
        print(f"- {key}: {value}")
    print()
    print("| setup | library | pairs/s |")
    print("| --- | --- | ---: |")
    for row in rows:
        rate = row["pairs_per_s"]
        shown = "not installed" if rate is None else f"{rate:,.0f}"
        if "vs_single" in row:
            shown += (
                f" ({row['vs_single']:.2f}x single, {row['cpu_us_per_pair']:.0f} µs client CPU"
                f" per pair, load {row['load_1min']:.1f})"
            )
        print(f"| {row['setup']} | {row['library']} | {shown} |")


if __name__ == "__main__":
    main()
