"""The benchmark's interleaved comparison with the blocking-socket limit (benchmarks/interleaved.py)
and its place in the report, on hand-made windows: no server, no timing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import interleaved
import report
from interleaved import Window


def _w(per_second: float, cpu_us: float = 10.0) -> Window:
    pairs = 1000
    return Window(pairs, pairs / per_second, cpu_us * pairs / 1e6)


def test_each_window_is_divided_by_the_limit_windows_around_it() -> None:
    # The machine doubles its speed after the second cycle: the limit's windows follow it.
    limits = [_w(4000), _w(4000), _w(8000), _w(8000)]
    runs = [_w(3400), _w(5100), _w(6800)]
    assert [round(r, 3) for r in interleaved.ratios(limits, runs)] == [0.85, 0.85, 0.85]
    # Against start and end alone (4,000 and 8,000) the same runs would read 0.57 to 1.13.


def test_summary_gives_median_min_and_cpu_per_pair() -> None:
    limits = [_w(10000, 25.0), _w(10000, 27.0), _w(10000, 26.0)]
    summary = interleaved.summarize(limits, {"redmutex": [_w(9000, 40.0), _w(7000, 42.0)]})
    peer = summary["peers"]["redmutex"]
    assert peer["ratio_median"] == 0.8
    assert peer["ratio_min"] == 0.7
    assert peer["ratios"] == [0.9, 0.7]
    assert peer["per_second_median"] == 8000.0
    assert peer["cpu_us_per_pair_median"] == 41.0
    assert summary["limit_cpu_us_per_pair_median"] == 26.0
    assert summary["limit_per_second_median"] == 10000.0


def _record(interleaved_record: dict[str, Any]) -> dict[str, Any]:
    return {
        "physical_limit": {
            "start": {"pair_limit": 8000.0, "raw_pair_limit": 4000.0},
            "end": {"pair_limit": 16000.0, "raw_pair_limit": 14000.0},
            "mean_pair_limit": 12000.0,
            "mean_raw_pair_limit": 9000.0,
            "drift_pct": 100.0,
            "interleaved": interleaved_record,
        },
        "config": {"benchmark_requests": 1000},
        "results": [],
        "errors": [],
    }


def test_report_has_the_interleaved_ratio_and_its_target() -> None:
    limits = [_w(10000), _w(10000), _w(10000)]
    measured = interleaved.summarize(
        limits,
        {
            "redmutex": [_w(9000), _w(8600)],
            "redmutex-fair": [_w(8000), _w(8200)],
            "redis-py": [_w(4000), _w(4000)],
        },
    )
    measured.update(cycles=2, window_s=0.15)
    record = _record(measured)
    report.add_ratios(record)
    ratios = record["ratios"]["uncontended"]
    assert ratios["redmutex/blocking_socket_limit_interleaved"] == 0.88
    assert ratios["redmutex-fair/blocking_socket_limit_interleaved_min"] == 0.8
    assert not any(k.startswith("redis-py") for k in ratios)
    targets = {t["where"]: t for t in record["targets"]}
    assert targets["redmutex, 1 thread, 1 name"]["met"] is True
    assert targets["redmutex-fair, 1 thread, 1 name"]["met"] is False
    text = "\n".join(report._interleaved(record))
    assert "in interleaved windows" in text
    assert "| redmutex | 8,800 | 0.88 | 0.86 | 10.0 | — |" in text
    assert "| redis-py | 4,000 | 0.40 | 0.40 |" in text


def test_rwlock_sides_are_compared_with_lock_cycle_by_cycle() -> None:
    # The machine slows down 2x in the second cycle: the read side keeps 0.95x of Lock's window
    # in each cycle, although its second window is slower than Lock's first.
    limits = [_w(10000), _w(6000), _w(5000)]
    measured = interleaved.summarize(
        limits,
        {
            "redmutex": [_w(8000), _w(4000)],
            report.RW_READ_INTERLEAVED: [_w(7600), _w(3800)],
            report.RW_WRITE_INTERLEAVED: [_w(6400), _w(3400)],
        },
        relative_to="redmutex",
    )
    measured.update(cycles=2, window_s=0.15)
    assert measured["relative_to"] == "redmutex"
    assert "vs_relative_median" not in measured["peers"]["redmutex"]
    read = measured["peers"][report.RW_READ_INTERLEAVED]
    assert (read["vs_relative_median"], read["vs_relative_min"]) == (0.95, 0.95)
    write = measured["peers"][report.RW_WRITE_INTERLEAVED]
    assert (write["vs_relative_median"], write["vs_relative_min"]) == (0.825, 0.8)
    record = _record(measured)
    report.add_ratios(record)
    targets = {t["where"]: t for t in record["targets"]}
    assert targets[report.RW_READ_INTERLEAVED]["met"] is True
    assert targets[report.RW_WRITE_INTERLEAVED]["met"] is False
    assert "median 0.82×, min 0.80×" in targets[report.RW_WRITE_INTERLEAVED]["measured"]
    # Neither side is taken for redmutex's own uncontended-vs-limit target.
    assert "redmutex RWLock read, 1 thread, 1 name" not in targets
    text = "\n".join(report._interleaved(record))
    assert "×redmutex, same cycle |" in text
    assert f"| {report.RW_READ_INTERLEAVED} | 5,700 |" in text and "| 0.95 |" in text


def test_report_without_or_with_a_failed_interleaved_measurement() -> None:
    record = _record({"error": "RuntimeError: boom"})
    report.add_ratios(record)
    assert record["targets"] == []
    assert "failed (RuntimeError: boom)" in "\n".join(report._interleaved(record))
    record = _record({})
    del record["physical_limit"]["interleaved"]
    report.add_ratios(record)
    assert "interleaved" not in "\n".join(report._interleaved(record))


def test_a_short_interleaved_run_against_a_real_server(redis_url: str, prefix: str) -> None:
    """The whole measurement, tiny: every peer window has a ratio, redmutex's own requests are
    caught and replayed (they take and give back its lock), and the lock still works after."""
    import redmutex
    from redis_target import Target

    client = redmutex.Client(redis_url)
    lock = redmutex.Lock(client, f"{prefix}:bench", ttl=10)
    with Target(redis_url) as target:
        replay = interleaved.captured_requests(target, lock)
        assert replay is not None
        assert all(r.startswith(b"*") and b"EVALSHA" in r for r in replay)
        lines: list[str] = []
        reader = redmutex.RWLock(client, f"{prefix}:bench-rw", ttl=10).read()
        record = interleaved.measure(
            target,
            {"redmutex": lock, "redmutex RWLock read": reader},
            f"{prefix}:phys",
            2,
            0.02,
            lines.append,
            replayed="redmutex",
            relative_to="redmutex",
        )
    assert record is not None
    peers = record["peers"]
    assert set(peers) == {
        "redmutex",
        "redmutex RWLock read",
        "redmutex's requests, blocking socket",
    }
    for peer in peers.values():
        assert len(peer["ratios"]) == 2 and peer["ratio_min"] > 0
    assert peers["redmutex RWLock read"]["vs_relative_min"] > 0
    assert reader.acquire(blocking=False)
    reader.release()
    assert len(record["limit_per_second"]) == 3
    assert lock.acquire(blocking=False)
    lock.release()
    assert any("interleaved / limit" in line for line in lines)


def test_the_replay_catches_an_acquire_and_a_release_on_a_fresh_server(
    make_server: Any, prefix: str
) -> None:
    """On a server that has not seen redmutex's scripts, the first EVALSHA of each is refused
    (NOSCRIPT) and sent again after SCRIPT LOAD: the replay must still hold one acquire and
    one release (two acquires would keep the lock taken and stall the lock's own windows)."""
    import redmutex
    from redis_target import Target

    server = make_server()
    client = redmutex.Client(server.url)
    lock = redmutex.Lock(client, f"{prefix}:fresh", ttl=10)
    with Target(server.url) as target:
        replay = interleaved.captured_requests(target, lock)
    assert replay is not None
    acquire, release = replay
    assert acquire != release
    assert b":lock:queue" not in acquire and b":lock:queue" in release  # only the release names it
    client.close()
