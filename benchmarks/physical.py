"""The physical limit: how many round trips one connection gets, measured with redis-benchmark.

An acquire+release pair is at least one `SET NX PX` and one `EVALSHA` round trip, so

    pair limit = 1 / (1 / rps_set + 1 / rps_evalsha)   pairs/s

is what a single connection can do at best; a lock library can only approach it from below.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from redis_target import Target

FORMULA = "pair limit = 1 / (1/rps_set + 1/rps_evalsha)"

# The EVALSHA leg: the smallest script that does what an acquire does (one SET NX PX).
SET_NX_PX_SCRIPT = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"

_RESULT = re.compile(r"([0-9.]+) requests per second(?:, p50=([0-9.]+) msec)?")


@dataclass(frozen=True)
class PhysicalLimit:
    when: str
    requests: int
    set_rps: float
    evalsha_rps: float
    set_p50_us: float | None
    evalsha_p50_us: float | None

    @property
    def pair_limit(self) -> float:
        return pair_limit(self.set_rps, self.evalsha_rps)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pair_limit": round(self.pair_limit, 1)}


def pair_limit(set_rps: float, evalsha_rps: float) -> float:
    return 1.0 / (1.0 / set_rps + 1.0 / evalsha_rps)


def _run_benchmark(target: Target, requests: int, command: list[str]) -> tuple[float, float | None]:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark is not installed (make redis-server installs it)")
    args = [binary, *target.benchmark_args(), "-c", "1", "-n", str(requests), "-q", *command]
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=60 + requests / 1000, check=False
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"redis-benchmark {command[0]} did not finish in time") from None
    # -q still prints progress lines separated by carriage returns; the summary is the last match.
    matches = _RESULT.findall(done.stdout)
    if done.returncode != 0 or not matches:
        detail = " ".join((done.stderr or done.stdout).split())[:200]
        raise RuntimeError(f"redis-benchmark {command[0]} failed: {detail}")
    rps, p50_ms = matches[-1]
    return float(rps), (round(float(p50_ms) * 1000, 1) if p50_ms else None)


def measure(target: Target, requests: int, when: str, key_prefix: str) -> PhysicalLimit:
    """Time `SET k v NX PX 10000` and an EVALSHA doing the same, on one connection each."""
    client = target.redis()
    try:
        sha = client.script_load(SET_NX_PX_SCRIPT)
    finally:
        client.close()
    set_key, eval_key = f"{key_prefix}:set", f"{key_prefix}:evalsha"
    set_rps, set_p50 = _run_benchmark(target, requests, ["SET", set_key, "v", "NX", "PX", "10000"])
    eval_rps, eval_p50 = _run_benchmark(
        target, requests, ["EVALSHA", sha, "1", eval_key, "v", "10000"]
    )
    return PhysicalLimit(when, requests, set_rps, eval_rps, set_p50, eval_p50)
