"""Every script in examples/ runs against the test redis-server and says OK."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# script -> a line its output must contain (besides the closing "OK: ...")
EXPECTED = {
    "transfer_funds.py": "balances (70, 130)",
    "transfer_funds_multi.py": "money conserved: True",
    "with_lock.py": "another worker tries meanwhile: acquired=False",
    "game_turns.py": "moves recorded per game: [20, 20]",
    "fair_semaphore.py": "served in arrival order",
    "fencing.py": "the stale write with fence",
    "auto_renew.py": "on_lost: the lease of",
    "asyncio_lock.py": "jobs ran one at a time: True",
    "asyncio_cache.py": "the fill ran 1 time(s)",
}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


def run_example(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert EXPECTED[script] in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1].startswith("OK: "), done.stdout
    return done.stdout


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script: str, redis_url: str) -> None:
    run_example(script, redis_url)


def test_example_takes_the_url_from_the_environment(redis_url: str) -> None:
    run_example("with_lock.py", env={"REDIS_URL": redis_url})
