"""The benchmark's separate RWLock scenarios, each round framed by a Lock run just before and just
after (benchmarks/scenarios.py), and the verdict the report draws from those rounds."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import report
from scenarios import QUICK, SCENARIOS, Context


def _row(scenario: str, per_second: float, rounds: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "title": scenario,
        "peer": report.SUBJECT,
        "status": "ok",
        "per_second": per_second,
        "lock_per_second": sorted(lock for _, lock in rounds)[len(rounds) // 2],
        "rounds": [
            {"per_second": rw, "lock_per_second": lock, "vs_lock": round(rw / lock, 3)}
            for rw, lock in rounds
        ],
    }


def _targets(by_key: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    record = {"physical_limit": {}, "results": list(by_key.values())}
    return {
        t["where"]: t
        for t in report._targets(record, by_key)
        if t["target"].startswith("RWLock pairs/s")
    }


def test_the_verdict_is_the_median_of_the_rounds_against_their_own_lock_runs() -> None:
    # The uncontended Lock ran minutes earlier in a fast phase (6,000 pairs/s); the machine then
    # slowed down: against it the read side reads 0.70x, against the Lock runs of its own rounds
    # 0.95x. The write side is 0.85x of its rounds' Lock runs: not met, whatever the phase.
    by_key = {
        ("uncontended", report.SUBJECT): {"per_second": 6000.0, "peer": report.SUBJECT},
        ("rwlock-read", report.SUBJECT): _row(
            "rwlock-read", 4200, [(4275, 4500), (4180, 4400), (3800, 4000)]
        ),
        ("rwlock-write", report.SUBJECT): _row(
            "rwlock-write", 3740, [(3825, 4500), (3740, 4400), (3400, 4000)]
        ),
    }
    targets = _targets(by_key)
    read, write = targets["redmutex, rwlock-read"], targets["redmutex, rwlock-write"]
    assert read["met"] is True
    assert "0.95× (median of 3 rounds, 0.95–0.95)" in read["measured"], read
    assert "uncontended scenario's 6,000: 0.70×" in read["measured"], read
    assert write["met"] is False
    assert "0.85× (median of 3 rounds" in write["measured"], write


def test_without_rounds_against_lock_the_uncontended_scenario_is_the_reference() -> None:
    # A record of an older run (no Lock runs in the rounds): the ratio of the two scenarios.
    by_key = {
        ("uncontended", report.SUBJECT): {"per_second": 5000.0, "peer": report.SUBJECT},
        ("rwlock-read", report.SUBJECT): {"per_second": 4600.0, "rounds": [{}]},
    }
    read = _targets(by_key)["redmutex, rwlock-read"]
    assert read["met"] is True and "4,600 vs 5,000 pairs/s = 0.92×" in read["measured"]


def test_a_short_framed_run_against_a_real_server(redis_url: str, prefix: str) -> None:
    """Both sides' scenarios run for real, tiny: each round times the side and its Lock runs, and
    every lock is free again afterwards."""
    from peers import PEERS

    session = PEERS[report.SUBJECT].open(redis_url)
    try:
        sizes = replace(QUICK, pairs=40, warmup=5, max_seconds=0.3)
        for key in ("rwlock-read", "rwlock-write"):
            ctx = Context(namespace=prefix, sizes=sizes, peer=report.SUBJECT)
            measured = SCENARIOS[key].run(session, ctx)
            assert measured.operations == 40 and len(measured.latencies_ns) == 40
            assert measured.extra["lock_per_second"] > 0
            assert measured.extra["vs_lock"] == round(
                measured.per_second / measured.extra["lock_per_second"], 3
            )
            lock = session.lock(ctx.name("beside-lock"), 10.0)
            assert lock.acquire()
            lock.release()
    finally:
        session.close()
