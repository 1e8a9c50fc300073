"""Redis's own work per operation, in instructions: the same figure in a slow and a fast phase.

    .venv/bin/python benchmarks/server_work.py [--cycles N] [--json PATH]

The server CPU µs that run.py reads from `INFO cpu` swing by 2x with the machine's phase, and a
script's cost grows more than a plain command's when the server's caches are cold, so a change
of a few per cent in what the server does cannot be seen in them. This counts instead: it runs a
private redis-server under valgrind's callgrind, collecting only inside `processCommand` (the
execution of each command a client sent, with a script's inner calls; not the network I/O, the
event loop or the protocol parsing), and drives real operations through it:

- redmutex `Lock`, unfair and fair: an uncontended acquire+release pair, and a hand-off cycle
  between two clients (A acquires; B's acquire queues; A's release grants B; B releases). The
  hand-off's own share is the cycle less an uncontended pair;
- redis-py's `Lock`: a pair, and a failed attempt (what each 1 ms poll of a waiter costs);
- python-redis-lock's `Lock` (when installed): a pair;
- redmutex's `RWLock` (a read pair, a write pair) and `Semaphore` (a pair), uncontended.

Counts are per operation, averaged over `--cycles` runs after a warm-up; keep `--cycles` a
multiple of 50, since Redis runs a step of Lua's garbage collector every 50 script calls (a
step is worth a few thousand instructions per script call: fewer cycles can include one or
none). They do not depend on the machine's speed; they do on the redis-server build (its version
is printed). They are not time: a cold script costs more per instruction than a hot plain
command (see the README).
Needs valgrind (`apt-get install valgrind`); talks only to the private server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redmutex._server import RedisServer

COLLECT = "processCommand"  # top-level commands only: a script's inner calls do not re-enter it
_TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


class CountingServer(RedisServer):
    """redis-server under callgrind on a free loopback port; `stop()` (RedisServer's) ends exactly
    that process."""

    def start(self, wait: float = 90.0) -> CountingServer:
        args = [
            "valgrind", "--tool=callgrind", f"--toggle-collect={COLLECT}",
            f"--callgrind-out-file={self.dir}/callgrind.out",
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"valgrind redis-server exited with {self.process.returncode}")
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"redis-server under valgrind did not answer within {wait} s")

    def _control(self, flag: str) -> None:
        assert self.process is not None
        subprocess.run(
            ["callgrind_control", flag, str(self.process.pid)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def zero(self) -> None:
        self._control("-z")

    def dump(self) -> int:
        """Instructions collected since the last `zero()`."""
        before = set(glob.glob(f"{self.dir}/callgrind.out*"))
        self._control("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = set(glob.glob(f"{self.dir}/callgrind.out*")) - before
            for path in new:
                match = _TOTALS.search(Path(path).read_text(errors="replace"))
                if match:
                    os.remove(path)
                    return int(match.group(1))
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump")

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def per_op(server: CountingServer, op: Callable[[], Any], cycles: int, warmup: int = 5) -> float:
    """Instructions per call of `op`, after `warmup` calls (scripts loaded, subscribers made)."""
    for _ in range(warmup):
        op()
    server.zero()
    for _ in range(cycles):
        op()
    return server.dump() / cycles


def wait_until(probe: Callable[[], bool], timeout: float = 60.0) -> int:
    """Calls `probe` until it is true; returns how many calls it took."""
    deadline = time.monotonic() + timeout
    calls = 0
    while time.monotonic() < deadline:
        calls += 1
        if probe():
            return calls
        time.sleep(0.01)
    raise RuntimeError("timed out")


def lock_figures(
    server: CountingServer, plain: redis.Redis, probe_cost: float, fair: bool, cycles: int
) -> dict[str, float]:
    """A redmutex Lock's pair and hand-off, unfair or fair."""
    import redmutex
    from redmutex import _core

    kind = "fair" if fair else "unfair"
    name = f"work-{kind}"
    queue = _core._keys("redmutex:", name)["queue"]  # the key layout's one home (keys.rs)
    with redmutex.Client(server.url) as a, redmutex.Client(server.url) as b:
        lock_a = redmutex.Lock(a, name, ttl=60, fair=fair)
        lock_b = redmutex.Lock(b, name, ttl=60, fair=fair)

        def pair() -> None:
            lock_a.acquire()
            lock_a.release()

        probes = 0

        def handoff_cycle() -> None:
            nonlocal probes
            lock_a.acquire()
            waiter = threading.Thread(target=lock_b.acquire)
            waiter.start()
            probes += wait_until(lambda: plain.hlen(queue) >= 1)
            lock_a.release()
            waiter.join(timeout=120)
            if waiter.is_alive() or not lock_b.owned():
                raise RuntimeError("the queued waiter was not granted the lock")
            lock_b.release()

        pair_cost = per_op(server, pair, cycles)
        handoff_cycle()  # warm-up: subscribers, scripts, the waiter's first-attempt memo
        probes = 0
        server.zero()
        for _ in range(cycles):
            handoff_cycle()
        cycle_cost = (server.dump() - probes * probe_cost) / cycles
    return {
        f"redmutex {kind}: acquire+release pair": pair_cost,
        f"redmutex {kind}: hand-off cycle (2 acquires, 2 releases, B queued)": cycle_cost,
        f"redmutex {kind}: one hand-off (the cycle less a pair)": cycle_cost - pair_cost,
    }


def redmutex_figures(server: CountingServer, cycles: int) -> dict[str, float]:
    plain = redis.Redis(port=server.port)
    # The hand-off cycle's probe is a command too: its cost is measured and taken out.
    plain.hset("probe:queue", "x", "y")
    probe_cost = per_op(server, lambda: plain.hlen("probe:queue"), cycles)
    out = {"probe HLEN (taken out of the cycles)": probe_cost}
    for fair in (False, True):
        out.update(lock_figures(server, plain, probe_cost, fair, cycles))
    return out


def primitive_figures(server: CountingServer, cycles: int) -> dict[str, float]:
    """The other primitives' uncontended pairs: RWLock's read and write sides, a Semaphore's."""
    import redmutex

    with redmutex.Client(server.url) as client:
        rw = redmutex.RWLock(client, "work-rw", ttl=60)
        sem = redmutex.Semaphore(client, "work-sem", 2, ttl=60)

        def read_pair() -> None:
            with rw.read():
                pass

        def write_pair() -> None:
            with rw.write():
                pass

        def sem_pair() -> None:
            with sem:
                pass

        return {
            "redmutex RWLock: read acquire+release pair": per_op(server, read_pair, cycles),
            "redmutex RWLock: write acquire+release pair": per_op(server, write_pair, cycles),
            "redmutex Semaphore (limit 2): acquire+release pair": per_op(server, sem_pair, cycles),
        }


def peer_figures(server: CountingServer, cycles: int) -> dict[str, float]:
    client = redis.Redis(port=server.port)
    out: dict[str, float] = {}
    lock = client.lock("work-redis-py", timeout=60)
    other = client.lock("work-redis-py", timeout=60)

    def pair() -> None:
        lock.acquire()
        lock.release()

    out["redis-py: pair"] = per_op(server, pair, cycles)
    lock.acquire()
    out["redis-py: failed attempt"] = per_op(server, lambda: other.acquire(blocking=False), cycles)
    lock.release()
    # A 1 ms poller's hand-off: the waiter's attempt that missed, then its pair.
    one = out["redis-py: pair"] + out["redis-py: failed attempt"]
    out["redis-py-1ms: one hand-off with one missed poll"] = one
    try:
        import redis_lock
    except ImportError:
        return out
    prl = redis_lock.Lock(client, "work-prl", expire=60)

    def prl_pair() -> None:
        prl.acquire()
        prl.release()

    out["python-redis-lock: pair"] = per_op(server, prl_pair, cycles)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cycles", type=int, default=50, help="operations counted per figure (a multiple of 50)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("valgrind", "callgrind_control") if not shutil.which(tool)]
    if missing:
        print(f"needs {', '.join(missing)}: apt-get install valgrind", file=sys.stderr)
        return 2
    server = CountingServer().start()
    try:
        version = redis.Redis(port=server.port).info("server")["redis_version"]
        figures = {
            **redmutex_figures(server, args.cycles),
            **primitive_figures(server, args.cycles),
            **peer_figures(server, args.cycles),
        }
    finally:
        server.stop()
    print(f"Instructions redis-server {version} executes per operation (in {COLLECT}),")
    print(f"{args.cycles} operations each after a warm-up:\n")
    print("| operation | instructions |\n|---|---:|")
    for label, value in figures.items():
        print(f"| {label} | {value:,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"redis": version, **figures}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
