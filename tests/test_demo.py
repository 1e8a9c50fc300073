"""The demo's scenarios against a real redis-server: each returns 0 only if its invariant held."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from redmutex._demos.fair import fair_demo


@pytest.mark.timeout(120)
def test_fair_demo_grants_in_arrival_order(redis_url: str) -> None:
    out = io.StringIO()
    assert fair_demo(redis_url, waiters=3, out=out) == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    arrival = next(line for line in lines if "arrival order:" in line).split(":", 1)[1].split()
    grants = next(line for line in lines if "grant order:" in line).split(":", 1)[1].split("(")[0]
    assert sorted(arrival) == ["P1", "P2", "P3"]
    assert grants.split() == arrival
    assert "ok: granted in arrival order" in out.getvalue()


@pytest.mark.timeout(180)
def test_cli_demo_runs_every_scenario(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "redmutex", "demo", "--redis", redis_url, "--transfers", "50"],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: the total is conserved" in done.stdout
    assert "ok: granted in arrival order" in done.stdout
    assert "result:            ok" in done.stdout
