"""Issue 13, item 1: a process always exits with its own status.

When renewal finds leases lost just as the interpreter exits, the threads that report the loss
(the `redmutex` log line, `on_lost`) must not take the GIL while CPython finalizes: CPython ends
such a thread with pthread_exit, which cannot unwind through Rust frames, and the process
aborts (SIGABRT). Before the fix about 1 run in 6 aborted (14 of 90).

Each run is a forked child of one driver process (forking skips the interpreter start and the
import, so hundreds of runs stay cheap); the child leaves by SystemExit at module level, which
is a full, normal interpreter exit. The default run is bounded in count and time; set
REDMUTEX_EXIT_RUNS for a longer soak.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import PyProcs
from redmutex._server import RedisServer

# The driver: forks `runs` children one after another (at most `seconds` in all); each takes 20
# auto-renewed locks (ttl 60 ms), has their keys deleted by another connection, and exits 10 ms
# later, as renewal finds them lost. Prints {"statuses": [...]} (raw waitpid statuses).
DRIVER = r"""
import json, os, sys, time
import redis, redmutex
port, runs, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
statuses = []
stop_at = time.monotonic() + seconds
for i in range(runs):
    if time.monotonic() > stop_at:
        break
    pid = os.fork()
    if pid == 0:
        prefix = f"exit{os.getpid()}-{i}:"
        c = redmutex.Client(f"redis://127.0.0.1:{port}", prefix=prefix)
        on_lost = (lambda lock: None) if i % 2 else None
        locks = [
            redmutex.Lock(c, f"L{n}", ttl=0.06, auto_renew=True, on_lost=on_lost)
            for n in range(20)
        ]
        for lock in locks:
            assert lock.acquire(timeout=1)
        other = redis.Redis(port=port)
        other.delete(*[f"{prefix}{{L{n}}}:lock" for n in range(20)])
        time.sleep(0.01)
        sys.exit(3)  # a status of its own, through a normal interpreter exit
    statuses.append(os.waitpid(pid, 0)[1])
print(json.dumps({"statuses": statuses}))
"""


def _runs() -> int:
    return int(os.environ.get("REDMUTEX_EXIT_RUNS", "60"))


@pytest.mark.timeout(600)
def test_exit_while_renewal_finds_leases_lost_never_aborts(
    redis_server: RedisServer, procs: PyProcs
) -> None:
    runs = _runs()
    # Two drivers side by side: the box's two cores both busy, as when the race was seen.
    seconds = max(30.0, runs * 0.6)
    drivers = [
        procs.start(DRIVER, str(redis_server.port), str(runs // 2), str(seconds)) for _ in range(2)
    ]
    statuses: list[int] = []
    for proc in drivers:
        code, out, err = procs.wait(proc, seconds + 120)
        assert code == 0, err
        statuses += json.loads(out)["statuses"]
    signalled = [os.WTERMSIG(s) for s in statuses if os.WIFSIGNALED(s)]
    codes = [os.WEXITSTATUS(s) for s in statuses if os.WIFEXITED(s)]
    print(f"\n{len(statuses)} runs: {len(signalled)} killed by a signal {signalled[:5]}")
    assert len(statuses) >= min(runs, 40), f"only {len(statuses)} runs within the time bound"
    assert signalled == [], f"{len(signalled)} of {len(statuses)} runs died by a signal"
    assert codes == [3] * len(statuses), sorted(set(codes))
