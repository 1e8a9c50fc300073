"""The fault soak (issue 13): every fault kind of the fault tests at once, for minutes.

Not part of `make test` (marker `soak`): `make soak-faults` runs it, bounded by
REDMUTEX_SOAK_SECONDS (default 150). Eight processes take one lock over and over through the
fault proxy: blocking unfair ones (half with auto_renew), blocking fair ones and asyncio ones that
cancel a share of their acquires at random moments. Meanwhile the test injects, at random: a
SIGSTOP of a worker past its ttl, connection cuts, latency, black-holes, lost replies,
`CLIENT KILL TYPE pubsub`, `CLIENT PAUSE`, `SCRIPT FLUSH` and a restart of redis-server with no
data; and now and then starts a short process that exits while 20 auto-renewed holds with tiny
ttls are being lost (the interpreter-exit abort of issue 13 item 1).

Checked at the end, with the history checker of test_faults:
- 0 overlaps: no two sections whose release found the lease still ours ("valid") overlap, and
  fences are unique and increase in start order — across server restarts too. A loss that the
  library failed to report shows up here, as a "valid" section overlapping another holder's;
- 0 hangs: every worker finishes within its deadline plus a margin;
- 0 aborts: every worker and every exiting process exits with its own status (0);
- 0 cancelled acquires holding: an asyncio acquire that was cancelled leaves its object holding
  nothing;
- nothing of the lock left in Redis once the last lease ended.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from _helpers import wait_until
from _proxy import FaultProxy
from redmutex._server import RedisServer
from test_faults import Section, _check_history
from test_faults import _inject as _inject_fault_test_kind

SOAK_SECONDS = float(os.environ.get("REDMUTEX_SOAK_SECONDS", "150"))
WORKERS = 8
TTL = 0.6
MAX_SECTIONS = 100_000

pytestmark = pytest.mark.soak

# What test_faults' Jepsen run injects: a paused worker, cuts, latency, killed subscribers, a lost
# reply, black-holes.
FAULT_TEST_KINDS = ("pause", "cut", "latency", "pubsub", "drop-reply", "blackhole")

# A worker: argv = url prefix name ttl mode deadline out board index seed.
# mode: "unfair", "renew" (unfair, auto_renew), "fair", "aio" (asyncio, fair or not, cancels).
WORKER = r"""
import asyncio, json, mmap, random, sys, time, redmutex, redmutex.aio as aio
url, prefix, name, ttl, mode = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
deadline, out_path, board_path = float(sys.argv[6]), sys.argv[7], sys.argv[8]
index, seed = int(sys.argv[9]), int(sys.argv[10])
rng = random.Random(seed)
client = redmutex.Client(url, prefix=prefix, connect_timeout=1.0, command_timeout=1.0)
with open(board_path, "r+b") as f:
    board = mmap.mmap(f.fileno(), 0)
counts = dict(sections=0, valid=0, expired=0, unknown=0, acquire_errors=0, timeouts=0,
              release_errors=0, cancelled=0, cancel_kept=0, lock_errors=0)

def odd(err):
    # Any other library error (an unexpected reply, say) is a defect: counted and shown.
    counts["lock_errors"] += 1
    print(f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
out = open(out_path, "w")

def record(start, end, fence, status):
    counts["sections"] += 1
    counts[status] += 1
    out.write(json.dumps([start, end, fence, status]) + "\n")

def run_sync():
    fair, renew = mode == "fair", mode == "renew"
    lock = redmutex.Lock(client, name, ttl=ttl, fair=fair, auto_renew=renew)
    while time.monotonic() < deadline and counts["sections"] < MAX_SECTIONS:
        try:
            got = lock.acquire(timeout=2.0)
        except redmutex.ConnectionError:
            counts["acquire_errors"] += 1
            time.sleep(0.01)
            continue
        except redmutex.LockError as err:
            odd(err)
            lock = redmutex.Lock(client, name, ttl=ttl, fair=fair, auto_renew=renew)
            continue
        if not got:
            counts["timeouts"] += 1
            continue
        start, fence = time.monotonic(), lock.fence
        board[index] = 1
        time.sleep(rng.uniform(0.0, 0.004))
        end = time.monotonic()
        status = "unknown"
        for _ in range(5):
            try:
                lock.release()
                status = "valid"
                break
            except redmutex.LockLostError:
                status = "expired"
                break
            except redmutex.ConnectionError:
                counts["release_errors"] += 1
                time.sleep(0.05)
            except redmutex.LockError as err:
                odd(err)
                break
        board[index] = 0
        if status == "unknown":
            lock = redmutex.Lock(client, name, ttl=ttl, fair=fair, auto_renew=renew)
        record(start, end, fence, status)
        time.sleep(rng.uniform(0.0, 0.004))

async def run_aio():
    while time.monotonic() < deadline and counts["sections"] < MAX_SECTIONS:
        lock = aio.Lock(client, name, ttl=ttl, fair=rng.random() < 0.5)
        try:
            if rng.random() < 0.3:
                task = asyncio.ensure_future(lock.acquire(timeout=2.0))
                await asyncio.sleep(rng.uniform(0.0, 0.01))
                task.cancel()
                try:
                    got = await task
                except asyncio.CancelledError:
                    counts["cancelled"] += 1
                    if lock.token is not None:
                        counts["cancel_kept"] += 1
                    continue
            else:
                got = await lock.acquire(timeout=2.0)
        except redmutex.ConnectionError:
            counts["acquire_errors"] += 1
            await asyncio.sleep(0.01)
            continue
        except redmutex.LockError as err:
            odd(err)
            continue
        if not got:
            counts["timeouts"] += 1
            continue
        start, fence = time.monotonic(), lock.fence
        board[index] = 1
        await asyncio.sleep(rng.uniform(0.0, 0.004))
        end = time.monotonic()
        status = "unknown"
        for _ in range(5):
            try:
                await lock.release()
                status = "valid"
                break
            except redmutex.LockLostError:
                status = "expired"
                break
            except redmutex.ConnectionError:
                counts["release_errors"] += 1
                await asyncio.sleep(0.05)
            except redmutex.LockError as err:
                odd(err)
                break
        board[index] = 0
        record(start, end, fence, status)
        await asyncio.sleep(rng.uniform(0.0, 0.004))

if mode == "aio":
    asyncio.run(run_aio())
else:
    run_sync()
out.write(json.dumps({"counts": counts}) + "\n")
out.close()
""".replace("MAX_SECTIONS", str(MAX_SECTIONS))

# Exits while 20 auto-renewed holds with a 60 ms ttl are being lost: argv = url prefix.
EXITER = r"""
import sys, time, redis, redmutex
url, prefix = sys.argv[1], sys.argv[2]
client = redmutex.Client(url, prefix=prefix, connect_timeout=1.0, command_timeout=1.0)
locks = [redmutex.Lock(client, f"exit{i}", ttl=0.06, auto_renew=True) for i in range(20)]
try:  # Redis may be restarting: what matters is how the process ends, not these calls
    for lock in locks:
        lock.acquire(timeout=1.0)
    conn = redis.Redis.from_url(url, socket_timeout=1.0)
    keys = conn.keys(prefix + "*")
    if keys:
        conn.delete(*keys)
except Exception:
    pass
time.sleep(0.01)
"""


def _start(script: str, args: list[str], err: Path) -> subprocess.Popen[str]:
    with open(err, "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )


class _Soak:
    """The running soak: the server (restarted in place), the proxy, the workers."""

    def __init__(self, tmp: Path, rng: random.Random) -> None:
        self.tmp, self.rng = tmp, rng
        self.server = RedisServer().start()
        self.port = self.server.port
        self.procs: list[subprocess.Popen[str]] = []
        self.exiters: list[tuple[subprocess.Popen[str], Path]] = []

    def conn(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def restart(self) -> None:
        """SIGKILL redis-server (by PID) and start an empty one on the same port."""
        old = self.server
        assert old.process is not None
        os.kill(old.process.pid, signal.SIGKILL)
        old.process.wait(timeout=10)
        old.close()
        time.sleep(self.rng.uniform(0.0, 0.3))
        self.server = RedisServer(self.port).start()

    def exiter(self) -> None:
        n = len(self.exiters)
        err = self.tmp / f"exiter{n}.err"
        proc = _start(EXITER, [self.server.url, f"ex{n}:"], err)
        self.procs.append(proc)
        self.exiters.append((proc, err))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.server.close()


def _inject(
    kind: str,
    soak: _Soak,
    proxy: FaultProxy,
    workers: list[subprocess.Popen[str]],
    board: mmap.mmap,
    marker: bytes,
) -> str:
    rng = soak.rng
    if kind == "restart":
        soak.restart()
    elif kind == "exit":
        soak.exiter()
    else:  # the fault tests' own kinds, and commands sent straight to the server
        conn = soak.conn()
        try:
            if kind in FAULT_TEST_KINDS:
                return _inject_fault_test_kind(kind, rng, proxy, conn, workers, board, marker)
            if kind == "client-pause":
                conn.client_pause(int(rng.uniform(0.1, 0.7) * 1000))
            elif kind == "script-flush":
                conn.script_flush()
        finally:
            conn.close()
    return kind


@pytest.mark.timeout(SOAK_SECONDS + 240)
def test_soak_all_fault_kinds_together(tmp_path: Path) -> None:
    seed = int(os.environ.get("REDMUTEX_FAULT_SEED", random.randrange(2**32)))
    print(f"\nseed {seed}, {SOAK_SECONDS:.0f} s (REDMUTEX_FAULT_SEED, REDMUTEX_SOAK_SECONDS)")
    rng = random.Random(seed)
    prefix, name = "soak:", "soak"
    marker = ("{" + name + "}:lock").encode()
    board_path = tmp_path / "board"
    board_path.write_bytes(b"\0" * WORKERS)
    modes = ["unfair", "unfair", "renew", "renew", "fair", "fair", "aio", "aio"]
    faults: Counter[str] = Counter()
    soak = _Soak(tmp_path, rng)
    hung: list[int] = []
    exit_codes: dict[str, int] = {}
    try:
        with FaultProxy(soak.port) as proxy, open(board_path, "r+b") as board_file:
            board = mmap.mmap(board_file.fileno(), 0)
            deadline = time.monotonic() + SOAK_SECONDS
            workers = []
            for i, mode in enumerate(modes):
                args = [proxy.url, prefix, name, str(TTL), mode, repr(deadline),
                        str(tmp_path / f"worker{i}.jsonl"), str(board_path), str(i),
                        str(rng.randrange(2**32))]  # fmt: skip
                workers.append(_start(WORKER, args, tmp_path / f"worker{i}.err"))
            soak.procs.extend(workers)
            time.sleep(1.0)
            kinds = ["pause", "cut", "latency", "pubsub", "drop-reply", "blackhole", "restart",
                     "client-pause", "script-flush", "exit"]  # fmt: skip
            try:
                while time.monotonic() < deadline - 2.0:
                    time.sleep(rng.uniform(0.2, 0.6))
                    faults[_inject(rng.choice(kinds), soak, proxy, workers, board, marker)] += 1
            finally:
                proxy.disarm()
                proxy.heal()
                proxy.set_latency(0)
            for i, proc in enumerate(workers):
                try:
                    exit_codes[f"worker{i}"] = proc.wait(
                        timeout=max(deadline - time.monotonic(), 0) + 30
                    )
                except subprocess.TimeoutExpired:
                    hung.append(i)
            board.close()
        for n, (proc, _err) in enumerate(soak.exiters):
            try:
                exit_codes[f"exiter{n}"] = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                hung.append(100 + n)

        sections: list[Section] = []
        totals: Counter[str] = Counter()
        for i in range(WORKERS):
            if i in hung:
                continue
            lines = (tmp_path / f"worker{i}.jsonl").read_text().splitlines()
            tail = json.loads(lines[-1]) if lines else {}
            assert "counts" in tail, (
                f"worker {i} ({modes[i]}) did not finish its log:\n"
                + (tmp_path / f"worker{i}.err").read_text(errors="replace")[-3000:]
            )
            totals.update(tail["counts"])
            for line in lines[:-1]:
                start, end, fence, status = json.loads(line)
                sections.append(Section(start, end, fence, status, i))
        print(f"faults injected: {dict(sorted(faults.items()))}")
        print(f"totals: {dict(sorted(totals.items()))}")
        aborts = {k: rc for k, rc in exit_codes.items() if rc != 0}
        print(f"processes: {len(exit_codes)}, non-zero exits: {aborts}, hung: {hung}")

        # Every kind of failure is collected first, so one run reports all it saw.
        problems = _check_history(sections)
        if hung:
            problems.append(f"hung processes: {hung}")
        for k, rc in aborts.items():
            err = (tmp_path / f"{k}.err").read_text(errors="replace")[-2000:]
            problems.append(f"{k} exited with {rc}:\n{err}")
        if totals["lock_errors"]:
            errs = "".join(
                (tmp_path / f"worker{i}.err").read_text(errors="replace")[-1500:]
                for i in range(WORKERS)
            )
            problems.append(f"{totals['lock_errors']} unexpected library errors:\n{errs}")
        if totals["cancel_kept"]:
            problems.append(f"{totals['cancel_kept']} cancelled acquires left their object holding")
        assert not problems, "\n".join(p if len(p) < 1500 else p[:1500] + " ..." for p in problems)
        valid = [s for s in sections if s.status == "valid"]
        assert len(valid) >= 200, len(valid)
        assert sum(faults.values()) >= 20, faults

        conn = soak.conn()
        lock_key = (prefix + "{" + name + "}:lock").encode()
        wait_until(lambda: conn.exists(lock_key) == 0, 30 + 3, "the lock key to go")

        def leftovers() -> list[bytes]:
            return [k for k in conn.keys(prefix + "*") if not k.endswith(b":fence")]

        # A fair waiter that gave up leaves the queue at once; one that was cut off drops out
        # within its place's 10 s lease.
        wait_until(lambda: leftovers() == [], 30, "the queue keys to go")
        conn.close()
    finally:
        soak.stop()
