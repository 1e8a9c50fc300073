"""benchmarks/server_work.py: a redis-server under callgrind counts the same instructions for the
same work, and the per-operation figures it reports add up."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import server_work

# `make deps` installs valgrind; a machine without it cannot run the counting server at all.
pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
    reason="valgrind is not installed (make deps installs it)",
)


def test_the_same_work_counts_the_same_instructions() -> None:
    server = server_work.CountingServer().start()
    try:
        client = redis.Redis(port=server.port)
        client.rpush("list", "x")
        first = server_work.per_op(server, lambda: client.llen("list"), 40)
        again = server_work.per_op(server, lambda: client.llen("list"), 40)
        more = server_work.per_op(server, lambda: client.lrange("list", 0, -1), 40)
    finally:
        server.stop()
    assert server.process is None
    assert first > 0
    assert abs(again - first) <= 0.02 * first
    # A command that does more is counted as more: the figure is the server's work, not noise.
    assert more > first


def test_the_report_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "work.json"
    assert server_work.main(["--cycles", "6", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["redis"]
    for kind in ("unfair", "fair"):
        pair = figures[f"redmutex {kind}: acquire+release pair"]
        cycle = figures[f"redmutex {kind}: hand-off cycle (2 acquires, 2 releases, B queued)"]
        handoff = figures[f"redmutex {kind}: one hand-off (the cycle less a pair)"]
        assert 0 < pair < cycle
        assert handoff == pytest.approx(cycle - pair)
        # A hand-off runs the waiter's join and the granting release: more than a pair's work.
        assert handoff > pair
    assert 0 < figures["redis-py: failed attempt"] < figures["redis-py: pair"]
