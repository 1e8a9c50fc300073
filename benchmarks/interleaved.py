"""Uncontended pairs against the blocking-socket limit, measured in windows interleaved in time.

This machine's speed can change 2× within minutes, so a ratio of a scenario's pairs/s to a limit
measured at the start and the end of the run means little when the phase changed in between.
Here the limit and the peers take turns in short windows on the same name the whole time:

    limit, redmutex, redmutex-fair, redis-py, limit, redis-py, redmutex-fair, redmutex, limit, ...

(the order of the peers reversed every cycle, so none always follows the limit). The limit's
window is the blocking-socket pair of `physical.py`: `SET k v NX PX 10000` then the EVALSHA of a
script doing the same, each written on a blocking socket before blocking in read. Each peer window
is divided by the mean of the two limit windows around its cycle; the report gives the median and
the smallest of these ratios per peer, and the CPU time per pair of the client
(`time.process_time`, every thread of this process) and of the server (INFO cpu, read before and
after each window) beside the limit's own: what a pair costs beyond the limit's on each side of
its round trips. One more row takes turns too: redmutex's own two requests (caught once with
MONITOR) sent from the limit's socket and loop, i.e. redmutex's server work with the limit's
client.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import physical
import redis
from peers import LockHandle
from redis_target import Target
from timing import gc_paused

# How often a window looks at the clock (pairs): rarely enough not to cost, often enough to end
# within a few hundred µs of its length.
_CHECK_EVERY = 16

METHOD = (
    "short windows taken in turn on one name: the blocking-socket limit (SET NX PX, then EVALSHA"
    " of the same, each written before blocking in read), then each peer (order reversed every"
    " cycle), then the limit again; each peer window ÷ the mean of the two limit windows around"
    " its cycle; median and min over the cycles"
)


@dataclass(frozen=True)
class Window:
    pairs: int
    elapsed_s: float
    cpu_s: float
    server_cpu_us: float | None = None  # the server's CPU time in the window (INFO cpu)

    @property
    def per_second(self) -> float:
        return self.pairs / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cpu_us_per_pair(self) -> float:
        return self.cpu_s / self.pairs * 1e6 if self.pairs else 0.0

    @property
    def server_cpu_us_per_pair(self) -> float | None:
        if self.server_cpu_us is None or not self.pairs:
            return None
        return self.server_cpu_us / self.pairs


def timed_window(
    pair: Callable[[], None], seconds: float, server_cpu: Callable[[], float] | None = None
) -> Window:
    """Runs `pair` until `seconds` have passed (looking every `_CHECK_EVERY` pairs); with
    `server_cpu` (the server's CPU time so far, µs), also the server's CPU time it took."""
    clock, cpu = time.perf_counter, time.process_time
    server0 = server_cpu() if server_cpu else None
    cpu0 = cpu()
    start = clock()
    deadline = start + seconds
    done = 0
    while True:
        for _ in range(_CHECK_EVERY):
            pair()
        done += _CHECK_EVERY
        now = clock()
        if now >= deadline:
            cpu1 = cpu()
            server = server_cpu() - server0 if server_cpu and server0 is not None else None
            return Window(done, now - start, cpu1 - cpu0, server)


def lock_pair(lock: LockHandle) -> Callable[[], None]:
    acquire, release = lock.acquire, lock.release

    def pair() -> None:
        if not acquire():
            raise RuntimeError("an uncontended acquire() returned False")
        release()

    return pair


def socket_pair(
    send: Callable[[bytes], Any], recv: Callable[[int], bytes], first: bytes, second: bytes
) -> Callable[[], None]:
    def pair() -> None:
        send(first)
        if not recv(4096):  # every reply of these commands fits one small read
            raise RuntimeError("raw socket: the server closed the connection")
        send(second)
        if not recv(4096):
            raise RuntimeError("raw socket: the server closed the connection")

    return pair


def captured_requests(target: Target, lock: LockHandle) -> tuple[bytes, bytes] | None:
    """The two requests (EVALSHA) one acquire+release of `lock` sends, as the server saw them
    (MONITOR), packed again; None if they were not seen as two script calls (or the server
    refuses MONITOR: then only this reference is missing)."""
    # One pair first: on a server that has not seen the scripts yet, the first EVALSHA of each
    # is refused (NOSCRIPT) and sent again after SCRIPT LOAD, which would be caught instead.
    lock_pair(lock)()
    client = target.redis()  # socket timeout 10 s: a MONITOR that hears nothing ends
    seen: list[list[str]] = []
    try:
        with client.monitor() as monitor:
            lock_pair(lock)()
            while len(seen) < 2:
                command = monitor.next_command()
                if command is None:
                    return None
                if command["client_type"] == "lua":
                    continue  # the scripts' own calls
                args = str(command["command"]).split(" ")
                if args and args[0].upper() == "EVALSHA":
                    seen.append(args)
    except redis.RedisError:
        return None
    finally:
        client.close()
    first, second = (physical.resp(*args) for args in seen)
    return first, second


def ratios(limits: Sequence[Window], runs: Sequence[Window]) -> list[float]:
    """Each run of cycle i ÷ the mean of limit windows i and i + 1 (the ones around it)."""
    out = []
    for i, run in enumerate(runs):
        around = (limits[i].per_second + limits[i + 1].per_second) / 2
        if around > 0:
            out.append(run.per_second / around)
    return out


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def same_cycle_ratios(runs: Sequence[Window], reference: Sequence[Window]) -> list[float]:
    """Each run of cycle i ÷ the reference's run of the same cycle (taken a window apart)."""
    return [
        run.per_second / ref.per_second
        for run, ref in zip(runs, reference, strict=False)
        if ref.per_second > 0
    ]


def summarize(
    limits: Sequence[Window], runs: dict[str, list[Window]], relative_to: str | None = None
) -> dict[str, Any]:
    """The record of one interleaved measurement: per peer, the ratios to the limit windows
    around each of its windows (median, min, all), its median pairs/s, and the client's and the
    server's CPU µs per pair; with `relative_to` (a peer of `runs`), also each other peer's
    median ratio to that peer's window of the same cycle."""
    peers: dict[str, Any] = {}
    reference = runs.get(relative_to or "")
    for name, windows in runs.items():
        r = ratios(limits, windows)
        peers[name] = {
            "ratio_median": round(statistics.median(r), 3) if r else None,
            "ratio_min": round(min(r), 3) if r else None,
            "ratios": [round(x, 3) for x in r],
            "per_second_median": round(statistics.median(w.per_second for w in windows), 1),
            "cpu_us_per_pair_median": round(
                statistics.median(w.cpu_us_per_pair for w in windows), 1
            ),
            "server_cpu_us_per_pair_median": _median_or_none(
                [w.server_cpu_us_per_pair for w in windows]
            ),
        }
        if reference is not None and name != relative_to:
            same = same_cycle_ratios(windows, reference)
            if same:
                peers[name]["vs_relative_median"] = round(statistics.median(same), 3)
                peers[name]["vs_relative_min"] = round(min(same), 3)
    return {
        "method": METHOD,
        "limit_per_second": [round(w.per_second, 1) for w in limits],
        "limit_per_second_median": round(statistics.median(w.per_second for w in limits), 1),
        "limit_cpu_us_per_pair_median": round(
            statistics.median(w.cpu_us_per_pair for w in limits), 1
        ),
        "limit_server_cpu_us_per_pair_median": _median_or_none(
            [w.server_cpu_us_per_pair for w in limits]
        ),
        "peers": peers,
        "relative_to": relative_to if reference is not None else None,
    }


def measure(
    target: Target,
    locks: dict[str, LockHandle],
    key_prefix: str,
    cycles: int,
    window_s: float,
    log: Callable[[str], None],
    server_cpu: Callable[[], float] | None = None,
    replayed: str = "",
    relative_to: str | None = None,
) -> dict[str, Any] | None:
    """Interleaves `cycles` windows of `window_s` of each lock in `locks` (uncontended pairs on
    its own name) with windows of the blocking-socket limit; None where there is no blocking
    socket (TLS). `server_cpu` reads the server's CPU time so far in µs (INFO cpu): with it,
    each window also tells how much of the server's time its pairs took. `replayed` names a lock
    whose two requests (caught once with MONITOR) also take turns, sent from the limit's blocking
    socket: the same server work as that lock's pairs with the limit's client, which tells the
    client's share of a gap from the server's. `relative_to` names a lock that the others are
    also compared with, window by window in the same cycle (e.g. RWLock sides with Lock).
    """
    sock = physical.blocking_socket(target)
    if sock is None:
        return None
    client = target.redis()
    try:
        sha = client.script_load(physical.SET_NX_PX_SCRIPT)
    finally:
        client.close()
    replay = captured_requests(target, locks[replayed]) if replayed in locks else None
    with sock:
        set_cmd, eval_cmd = physical.limit_commands(sha, key_prefix)
        limit = socket_pair(sock.sendall, sock.recv, set_cmd, eval_cmd)
        pairs = {name: lock_pair(lock) for name, lock in locks.items()}
        if replay is not None:
            pairs[f"{replayed}'s requests, blocking socket"] = socket_pair(
                sock.sendall, sock.recv, *replay
            )
        warm = max(window_s / 2, 0.05)
        for pair in [limit, *pairs.values()]:
            timed_window(pair, warm)
        limits: list[Window] = []
        runs: dict[str, list[Window]] = {name: [] for name in pairs}
        order = list(pairs)
        with gc_paused():
            limits.append(timed_window(limit, window_s, server_cpu))
            for cycle in range(cycles):
                for name in order if cycle % 2 == 0 else order[::-1]:
                    runs[name].append(timed_window(pairs[name], window_s, server_cpu))
                limits.append(timed_window(limit, window_s, server_cpu))
    record = summarize(limits, runs, relative_to)
    record.update(cycles=cycles, window_s=window_s)
    for name, peer in record["peers"].items():
        log(
            f"  interleaved / {name}: {peer['per_second_median']:,.0f} pairs/s,"
            f" × blocking-socket limit median {peer['ratio_median']:.2f},"
            f" min {peer['ratio_min']:.2f}; CPU µs/pair: client {peer['cpu_us_per_pair_median']:.1f},"
            f" server {_num(peer['server_cpu_us_per_pair_median'])}"
            + (
                f"; × {relative_to} same cycle median {peer['vs_relative_median']:.2f}"
                if "vs_relative_median" in peer
                else ""
            )
        )
    log(
        f"  interleaved / limit: {record['limit_per_second_median']:,.0f} pairs/s median"
        f" ({min(record['limit_per_second']):,.0f}–{max(record['limit_per_second']):,.0f});"
        f" CPU µs/pair: client {record['limit_cpu_us_per_pair_median']:.1f},"
        f" server {_num(record['limit_server_cpu_us_per_pair_median'])}"
    )
    return record


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"
