"""The Semaphore section of the contract, against a real redis-server."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis
import redmutex
from _helpers import ResultThread as Worker
from _helpers import wait_until
from redmutex._server import RedisServer

# ---------------------------------------------------------------------------------- fixtures
# redis_url, prefix, client, r, other_client and children come from conftest.py.


def _python(
    children: list[subprocess.Popen[str]], script: str, *args: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    children.append(proc)
    return proc


# ---------------------------------------------------------------------------------- helpers

TOKEN_RE = re.compile(r"[0-9a-f]{32}")

# Live holders by the server's clock, in one atomic step.
LIVE_HOLDERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
"""


def holders_key(prefix: str, name: str) -> bytes:
    return f"{prefix}{{{name}}}:sem:holders".encode()


def prefix_keys(r: redis.Redis, prefix: str) -> set[bytes]:
    return set(r.scan_iter(match=prefix.encode() + b"*", count=1000))


def server_ms(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec * 1000 + usec / 1000


# ---------------------------------------------------------------------------------- basics


@pytest.mark.timeout(30)
def test_acquire_release_state(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    sem = redmutex.Semaphore(client, "basic", 2, ttl=5)
    assert sem.token is None and sem.remaining() is None and sem.lost is False
    assert sem.limit == 2 and sem.fair is True and sem.name == "basic" and sem.ttl == 5.0
    assert sem.holders() == 0
    assert sem.acquire() is True
    assert sem.token is not None and TOKEN_RE.fullmatch(sem.token)
    remaining = sem.remaining()
    assert remaining is not None and 4.0 < remaining <= 5.0
    assert sem.owned() is True
    assert sem.holders() == 1
    # every key lies under prefix{name}
    assert all(k.startswith(f"{prefix}{{basic}}".encode()) for k in prefix_keys(r, prefix))
    sem.release()
    assert sem.token is None and sem.owned() is False and sem.holders() == 0
    # nothing remains after a release
    assert prefix_keys(r, prefix) == set()


@pytest.mark.timeout(30)
def test_never_more_than_limit(client: redmutex.Client, other_client: redmutex.Client) -> None:
    sems = [redmutex.Semaphore(c, "lim", 3, ttl=10) for c in (client, other_client) * 2]
    assert [s.acquire(blocking=False) for s in sems] == [True, True, True, False]
    assert sems[0].holders() == 3
    assert sems[3].acquire(timeout=0.2) is False
    sems[1].release()
    assert sems[3].acquire(timeout=5) is True
    assert sems[0].holders() == 3
    for s in (sems[0], sems[2], sems[3]):
        s.release()
    assert sems[0].holders() == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fair", [True, False])
def test_tokens_are_distinct_per_hold(client: redmutex.Client, fair: bool) -> None:
    sem = redmutex.Semaphore(client, "tok", 5, fair=fair)
    seen = set()
    for _ in range(3):
        with sem:
            seen.add(sem.token)
    assert len(seen) == 3


@pytest.mark.timeout(30)
def test_not_reentrant_and_not_owned(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "re", 5)
    with pytest.raises(redmutex.LockNotOwnedError):
        sem.release()
    with pytest.raises(redmutex.LockNotOwnedError):
        sem.extend()
    assert sem.acquire()
    with pytest.raises(redmutex.LockError):
        sem.acquire()
    assert sem.holders() == 1
    sem.release()


@pytest.mark.timeout(30)
def test_extend_and_remaining(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    sem = redmutex.Semaphore(client, "ext", 2, ttl=1)
    assert sem.acquire()
    sem.extend(30)
    remaining = sem.remaining()
    assert remaining is not None and 29 < remaining <= 30
    score = r.zscore(holders_key(prefix, "ext"), sem.token or "")
    assert score is not None
    assert 29_000 < score - server_ms(r) <= 30_000
    time.sleep(1.3)  # past the first ttl
    assert sem.owned()
    sem.extend()  # back to the semaphore's ttl
    remaining = sem.remaining()
    assert remaining is not None and remaining <= 1.0
    sem.release()


@pytest.mark.timeout(30)
def test_expired_lease_is_lost(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "exp", 1, ttl=0.2)
    assert sem.acquire()
    time.sleep(0.4)
    assert sem.remaining() == 0.0
    assert sem.owned() is False
    assert sem.holders() == 0
    with pytest.raises(redmutex.LockLostError):
        sem.extend()
    assert sem.lost is True
    with pytest.raises(redmutex.LockLostError):
        sem.release()
    assert sem.token is None and sem.lost is True
    assert sem.acquire()
    assert sem.lost is False
    sem.release()


@pytest.mark.timeout(30)
def test_lost_when_removed_externally(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    sem = redmutex.Semaphore(client, "gone", 3, ttl=10)
    assert sem.acquire()
    r.zrem(holders_key(prefix, "gone"), sem.token or "")
    with pytest.raises(redmutex.LockLostError, match="lock was lost"):
        sem.release()
    assert sem.lost is True


# ---------------------------------------------------------------------------------- with


@pytest.mark.timeout(30)
def test_with_binds_and_releases(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    sem = redmutex.Semaphore(client, "w", 2, ttl=5)
    with sem as x:
        assert x is sem
        assert sem.owned()
    assert sem.token is None
    assert prefix_keys(r, prefix) == set()


@pytest.mark.timeout(30)
def test_with_timeout_raises(client: redmutex.Client, other_client: redmutex.Client) -> None:
    holder = redmutex.Semaphore(other_client, "wt", 1, ttl=20)
    assert holder.acquire()
    waiter = redmutex.Semaphore(client, "wt", 1, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(redmutex.LockTimeoutError), waiter:
        pytest.fail("the block must not run")
    assert 0.25 <= time.monotonic() - t0 < 3.0
    with pytest.raises(TimeoutError), redmutex.Semaphore(client, "wt", 1, timeout=0):
        pass
    assert waiter.token is None
    holder.release()


@pytest.mark.timeout(30)
def test_with_lost_lease_raises_on_exit(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "wl", 2, ttl=0.2)
    with pytest.raises(redmutex.LockLostError, match="lock was lost"), sem:
        time.sleep(0.5)
    assert sem.lost is True and sem.token is None


@pytest.mark.timeout(30)
def test_with_block_error_and_loss_logs(
    client: redmutex.Client, caplog: pytest.LogCaptureFixture
) -> None:
    sem = redmutex.Semaphore(client, "wle", 2, ttl=0.2)
    with caplog.at_level(logging.WARNING, logger="redmutex"), pytest.raises(KeyError), sem:
        time.sleep(0.5)
        raise KeyError("from the block")
    assert any(
        rec.name == "redmutex" and rec.levelno == logging.WARNING for rec in caplog.records
    ), caplog.records
    assert sem.lost is True


# ---------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (2**70, ValueError),
        (True, TypeError),
        (2.0, TypeError),
        ("3", TypeError),
        (None, TypeError),
    ],
)
def test_bad_limit(client: redmutex.Client, limit: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        redmutex.Semaphore(client, "bad", limit)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fair", [True, False])
def test_largest_limit(client: redmutex.Client, fair: bool) -> None:
    # counts pass through Lua numbers (doubles): the largest limit accepted still works exactly
    a, b = (redmutex.Semaphore(client, "big", 2**52, fair=fair) for _ in range(2))
    assert a.acquire(timeout=5) and b.acquire(timeout=5)
    assert a.holders() == 2
    a.release()
    b.release()


@pytest.mark.parametrize(
    ("kwargs", "error", "arg"),
    [
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": -1.0}, ValueError, "ttl"),
        ({"ttl": math.nan}, ValueError, "ttl"),
        ({"ttl": math.inf}, ValueError, "ttl"),
        ({"ttl": "1"}, TypeError, "ttl"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"timeout": 10**30}, ValueError, "timeout"),
        ({"fair": 1}, TypeError, "fair"),
        ({"auto_renew": "yes"}, TypeError, "auto_renew"),
        ({"on_lost": 5}, TypeError, "on_lost"),
    ],
)
def test_bad_arguments(
    client: redmutex.Client, kwargs: dict[str, object], error: type[Exception], arg: str
) -> None:
    with pytest.raises(error, match=arg):
        redmutex.Semaphore(client, "bad", 2, **kwargs)  # type: ignore[arg-type]


def test_bad_names(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="name"):
        redmutex.Semaphore(client, "", 1)
    with pytest.raises(ValueError, match="name"):
        redmutex.Semaphore(client, "\ud800", 1)
    with pytest.raises(TypeError, match="name"):
        redmutex.Semaphore(client, b"x", 1)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_acquire_arguments(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "args", 1)
    with pytest.raises(ValueError, match="timeout"):
        sem.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        sem.acquire(timeout=-1)
    with pytest.raises(TypeError, match="blocking"):
        sem.acquire(blocking="no")  # type: ignore[arg-type]
    assert sem.token is None


@pytest.mark.timeout(30)
def test_client_forms(redis_url: str, r: redis.Redis) -> None:
    for c in (redis_url, r):
        sem = redmutex.Semaphore(c, f"forms-{uuid.uuid4().hex}", 1)
        assert sem.acquire(timeout=5)
        sem.release()


@pytest.mark.timeout(30)
def test_names_are_binary_safe(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    for name in ["a\x00b", "{x}", "ключ-🔒"]:
        sem = redmutex.Semaphore(client, name, 1)
        assert sem.acquire(timeout=5)
        assert r.zscore(holders_key(prefix, name), sem.token or "") is not None
        sem.release()


# ---------------------------------------------------------------------------------- waiting


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fair", [True, False])
def test_waiter_wakes_promptly_on_release(
    client: redmutex.Client, other_client: redmutex.Client, fair: bool
) -> None:
    holder = redmutex.Semaphore(other_client, "prompt", 1, ttl=30, fair=fair)
    assert holder.acquire()
    waiter = redmutex.Semaphore(client, "prompt", 1, ttl=30, fair=fair)
    th = Worker(lambda: waiter.acquire(timeout=20))
    th.start()
    time.sleep(0.5)
    released_at = time.monotonic()
    holder.release()
    assert th.outcome(20) is True
    assert th.finished_at is not None
    assert th.finished_at - released_at < 1.0
    waiter.release()


def _script_calls(conn: redis.Redis) -> int:
    """Script runs so far (the commands a script runs inside count in other statistics)."""
    stats = conn.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fair", [True, False])
def test_waiting_does_not_poll(fair: bool) -> None:
    with RedisServer() as server:
        watcher = redis.Redis(host="127.0.0.1", port=server.port)
        holder_client = redmutex.Client(server.url, prefix="np:")
        waiter_client = redmutex.Client(server.url, prefix="np:")
        try:
            holder = redmutex.Semaphore(holder_client, "quiet", 1, ttl=60, fair=fair)
            assert holder.acquire()
            waiters = [
                redmutex.Semaphore(waiter_client, "quiet", 1, ttl=10, fair=fair) for _ in range(4)
            ]
            threads = [Worker(lambda w=w: w.acquire(timeout=4)) for w in waiters]
            for th in threads:
                th.start()
            time.sleep(1.0)
            before = _script_calls(watcher)
            time.sleep(2.5)
            during = _script_calls(watcher) - before
            for th in threads:
                assert th.outcome(15) is False
            # Unfair: one waiter per process competes, and it sleeps until the holder's lease
            # ends. Fair: each waiter refreshes its queue place every 2 s. A poll would be dozens.
            bound = 4 * 2 if fair else 1
            assert during <= bound, f"{during} attempts while waiting"
            holder.release()
        finally:
            holder_client.close()
            waiter_client.close()
            watcher.close()


@pytest.mark.timeout(60)
def test_fair_waiters_are_served_in_order(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis
) -> None:
    holder = redmutex.Semaphore(client, "fifo", 2, ttl=30)
    other = redmutex.Semaphore(client, "fifo", 2, ttl=30)
    assert holder.acquire() and other.acquire()
    order: list[int] = []
    lock = threading.Lock()
    clients = [redmutex.Client(redis_url, prefix=prefix) for _ in range(5)]

    def wait_then_hold(i: int) -> bool:
        sem = redmutex.Semaphore(clients[i], "fifo", 2, ttl=30)
        ok = sem.acquire(timeout=30)
        with lock:
            order.append(i)
        time.sleep(0.05)
        sem.release()
        return ok

    threads = []
    queue = f"{prefix}{{fifo}}:sem:queue".encode()
    try:
        for i in range(5):
            th = Worker(lambda i=i: wait_then_hold(i))
            th.start()
            threads.append(th)
            wait_until(lambda i=i: r.llen(queue) == i + 1, 20, f"waiter {i} queued")  # type: ignore[misc]
        holder.release()  # one permit: waiters go one at a time, in arrival order
        for th in threads:
            assert th.outcome(30) is True
        assert order == [0, 1, 2, 3, 4]
    finally:
        other.release()
        for c in clients:
            c.close()


@pytest.mark.timeout(60)
def test_fair_newcomer_does_not_jump_the_queue(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    holder = redmutex.Semaphore(client, "nojump", 1, ttl=30)
    assert holder.acquire()
    queued = redmutex.Semaphore(other_client, "nojump", 1, ttl=30)
    th = Worker(lambda: queued.acquire(timeout=30))
    th.start()
    queue = f"{prefix}{{nojump}}:sem:queue".encode()
    wait_until(lambda: r.llen(queue) == 1, 20, "the waiter queued")
    newcomer = redmutex.Semaphore(client, "nojump", 1, ttl=30)
    holder.release()
    # the queued waiter has the free permit by right; a newcomer trying once does not get it
    got = newcomer.acquire(blocking=False)
    assert th.outcome(10) is True
    assert got is False
    queued.release()


@pytest.mark.timeout(60)
def test_fair_waiter_that_gives_up_leaves_the_queue(
    client: redmutex.Client, other_client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    holder = redmutex.Semaphore(client, "leave", 1, ttl=30)
    assert holder.acquire()
    quitter = redmutex.Semaphore(other_client, "leave", 1, ttl=30)
    patient = redmutex.Semaphore(client, "leave", 1, ttl=30)
    queue = f"{prefix}{{leave}}:sem:queue".encode()
    th = Worker(lambda: quitter.acquire(timeout=2.0))
    th.start()
    wait_until(lambda: r.llen(queue) == 1, 20, "the quitter queued")
    th2 = Worker(lambda: patient.acquire(timeout=30))
    th2.start()
    # Both queued before the quitter gives up (unless a starved machine stalled 2 s).
    wait_until(lambda: r.llen(queue) == 2 or th.finished_at is not None, 20, "the patient one")
    assert th.outcome(10) is False
    wait_until(lambda: r.llen(queue) >= 1, 20, "the patient one queued")
    assert r.lrange(queue, 0, -1) == [(patient_token := r.lindex(queue, 0))]
    assert patient_token is not None
    released_at = time.monotonic()
    holder.release()
    assert th2.outcome(10) is True
    assert th2.finished_at is not None and th2.finished_at - released_at < 1.0
    patient.release()
    assert prefix_keys(r, prefix) == set()


# ------------------------------------------------------------------ dead holders, auto_renew

HOLDER_SCRIPT = """
import sys, time, redmutex
url, prefix, name, limit, ttl = sys.argv[1:6]
client = redmutex.Client(url, prefix=prefix)
sems = [redmutex.Semaphore(client, name, int(limit), ttl=float(ttl)) for _ in range(int(limit))]
for s in sems:
    assert s.acquire(timeout=10)
print(repr(time.monotonic()), flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fair", [True, False])
def test_killed_holders_stop_counting_after_ttl(
    client: redmutex.Client,
    redis_url: str,
    prefix: str,
    children: list[subprocess.Popen[str]],
    fair: bool,
) -> None:
    ttl = 1.5
    proc = _python(children, HOLDER_SCRIPT, redis_url, prefix, "dead", "3", str(ttl))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    t_held = float(line)  # CLOCK_MONOTONIC is shared by the processes of one host
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    waiter = redmutex.Semaphore(client, "dead", 3, ttl=10, fair=fair)
    assert waiter.holders() == 3
    assert waiter.acquire(timeout=15) is True
    waited = time.monotonic() - t_held
    assert ttl - 0.05 <= waited < ttl + 1.5
    waiter.release()


@pytest.mark.timeout(30)
def test_auto_renew_keeps_the_permit(client: redmutex.Client) -> None:
    sem = redmutex.Semaphore(client, "renew", 1, ttl=0.4, auto_renew=True)
    with sem:
        time.sleep(1.5)
        assert sem.owned()
        assert redmutex.Semaphore(client, "renew", 1).acquire(blocking=False) is False
    assert sem.lost is False


@pytest.mark.timeout(30)
def test_auto_renew_reports_loss(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    called = threading.Event()
    seen: list[object] = []

    def on_lost(obj: object) -> None:
        seen.append(obj)
        called.set()

    sem = redmutex.Semaphore(client, "renew-lost", 2, ttl=0.6, auto_renew=True, on_lost=on_lost)
    assert sem.acquire()
    r.delete(holders_key(prefix, "renew-lost"))
    assert called.wait(5)
    assert seen == [sem]
    assert sem.lost is True
    with pytest.raises(redmutex.LockLostError):
        sem.release()


# ------------------------------------------------------------------------- client clocks

SKEWED_SCRIPT = """
import json, sys, time, redmutex
url, prefix, name, skew, rounds = sys.argv[1:6]
real_time = time.time
time.time = lambda: real_time() + float(skew)   # this process's wall clock is far off
client = redmutex.Client(url, prefix=prefix)
got = 0
for _ in range(int(rounds)):
    sem = redmutex.Semaphore(client, name, 2, ttl=5)
    assert sem.acquire(timeout=30)
    got += 1
    time.sleep(0.02)
    sem.release()
print(json.dumps({"got": got, "clock": time.time()}), flush=True)
"""


@pytest.mark.timeout(120)
def test_client_clock_skew_cannot_break_the_limit(
    redis_url: str, prefix: str, r: redis.Redis, children: list[subprocess.Popen[str]]
) -> None:
    # Two processes whose clocks are a day apart (one ahead, one behind) share a 2-permit
    # semaphore. Leases are scored by Redis TIME inside the scripts, so neither can see the
    # other's permits as expired (nor make its own look longer): the limit holds, and every
    # lease end stored lies within ttl of the server's clock.
    key = holders_key(prefix, "skew")
    stop = threading.Event()
    seen: list[int] = []
    bad_scores: list[float] = []

    def sample() -> None:
        probe = redis.Redis.from_url(redis_url)
        live = probe.register_script(LIVE_HOLDERS)
        while not stop.is_set():
            seen.append(int(live(keys=[key])))
            now = server_ms(probe)
            for _, score in probe.zrange(key, 0, -1, withscores=True):
                if not now - 50 <= score <= now + 5_000 + 50:
                    bad_scores.append(score - now)
            time.sleep(0.002)
        probe.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = [
        _python(children, SKEWED_SCRIPT, redis_url, prefix, "skew", skew, "40")
        for skew in ("86400", "-86400", "86400", "-86400")
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    stop.set()
    sampler.join(10)
    # the patch was in effect in the children, and was not on the path
    assert any(abs(o["clock"] - time.time()) > 80_000 for o in outputs)
    assert all(o["got"] == 40 for o in outputs)
    assert seen and max(seen) <= 2
    assert max(seen) == 2  # there was contention to speak of
    assert bad_scores == []


# ------------------------------------------------------------------------ killing under load

RUNNER_SCRIPT = r"""
import json, os, random, signal, sys, time
import redis, redmutex
url, prefix, name, limit, ttl, spec = sys.argv[1:7]
spec = json.loads(spec)   # [[worker id, doomed], ...]
key = f"{prefix}{{{name}}}:sem:holders"

def worker(wid, doomed, wfd):
    # a forked child: a fresh client (redmutex gives a child new connections)
    probe = redis.Redis.from_url(url)
    client = redmutex.Client(url, prefix=prefix)
    sem = redmutex.Semaphore(client, name, int(limit), ttl=float(ttl), timeout=120)
    if not sem.acquire():
        os.write(wfd, b"timeout\n")
        os._exit(3)
    sec, usec = probe.time()
    lease_end = probe.zscore(key, sem.token)
    os.write(wfd, f"acq {sem.token} {sec * 1e6 + usec} {lease_end}\n".encode())
    if doomed:
        # Held until the parent's SIGKILL lands: a doomed worker that finished its short hold
        # first (a loaded machine) would exit on its own, and the kill would find no hold.
        time.sleep(60)
    time.sleep(random.uniform(0.01, 0.06))
    sec, usec = probe.time()
    os.write(wfd, f"rel {sec * 1e6 + usec}\n".encode())
    sem.release()
    os._exit(0)

for wid, doomed in spec:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            worker(wid, doomed, wfd)
        finally:
            os._exit(4)
    os.close(wfd)
    reader = os.fdopen(rfd)
    first = reader.readline().split()
    record = {"id": wid, "doomed": doomed}
    if first and first[0] == "acq":
        record.update(token=first[1], acq_us=float(first[2]), lease_end_ms=float(first[3]))
        if doomed:
            os.kill(pid, signal.SIGKILL)        # mid-hold
            sec, usec = redis.Redis.from_url(url).time()
            record["killed_at_ms"] = sec * 1000 + usec / 1000
        else:
            second = reader.readline().split()
            if second and second[0] == "rel":
                record["rel_us"] = float(second[1])
    else:
        record["error"] = " ".join(first)
    reader.close()
    _, status = os.waitpid(pid, 0)
    record["status"] = status
    print(json.dumps(record), flush=True)
"""


@pytest.mark.timeout(300)
def test_200_workers_8_processes_10_percent_killed(
    redis_url: str, prefix: str, children: list[subprocess.Popen[str]]
) -> None:
    limit, ttl, n_workers, n_procs = 5, 1.0, 200, 8
    rng = random.Random(20240605)
    doomed = set(rng.sample(range(n_workers), n_workers // 10))
    plans: list[list[list[int | bool]]] = [[] for _ in range(n_procs)]
    for wid in range(n_workers):
        plans[wid % n_procs].append([wid, wid in doomed])
    key = holders_key(prefix, "load")

    stop = threading.Event()
    samples: list[int] = []

    def sample() -> None:
        probe = redis.Redis.from_url(redis_url)
        live = probe.register_script(LIVE_HOLDERS)
        while not stop.is_set():
            samples.append(int(live(keys=[key])))
        probe.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = [
        _python(
            children, RUNNER_SCRIPT, redis_url, prefix, "load", str(limit), str(ttl), json.dumps(p)
        )
        for p in plans
    ]
    records = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            records += [json.loads(line) for line in out.splitlines() if line.strip()]
    finally:
        stop.set()
        sampler.join(10)

    assert len(records) == n_workers
    killed = [rec for rec in records if rec["doomed"]]
    survivors = [rec for rec in records if not rec["doomed"]]
    assert len(killed) == n_workers // 10
    # every worker that was not killed got a permit (and gave it back)
    assert all("rel_us" in rec and rec["status"] == 0 for rec in survivors), [
        rec for rec in survivors if "rel_us" not in rec or rec["status"] != 0
    ]
    assert all(os.WIFSIGNALED(rec["status"]) for rec in killed)
    # sampled holders never exceed the limit
    assert len(samples) > 100
    assert max(samples) <= limit, max(samples)
    assert max(samples) == limit
    # the holds, by the server's clock: a survivor from its grant to its release, a killed one
    # from its grant to its lease end; never more than `limit` of them at any instant
    events = []
    for rec in survivors:
        events += [(rec["acq_us"], 1), (rec["rel_us"], -1)]
    for rec in killed:
        events += [(rec["acq_us"], 1), (rec["lease_end_ms"] * 1000, -1)]
        # a leaked permit comes back within ttl (+ margin) of the kill
        assert rec["lease_end_ms"] - rec["killed_at_ms"] <= ttl * 1000 + 50
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    assert peak <= limit
    # and when all is over, nothing is left behind once the last lease ended
    probe = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + ttl + 2.0
    while time.monotonic() < deadline and probe.exists(key):
        time.sleep(0.05)
    assert not probe.exists(key)
    assert set(probe.scan_iter(match=prefix.encode() + b"*")) == set()
    probe.close()


# ---------------------------------------------------------------------------------- demo


@pytest.mark.timeout(120)
def test_semaphore_demo(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from redmutex._demos.semaphore import LIMIT, semaphore_demo

    assert semaphore_demo(redis_url) == 0
    out = capsys.readouterr().out
    peak = int(re.search(r"peak concurrency:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert 1 <= peak <= LIMIT
    assert "result:            ok" in out
