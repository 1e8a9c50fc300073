"""What the numbers were measured on: date, CPUs, load, Python and Redis versions."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import subprocess
from typing import Any

import redis


def _command(args: list[str]) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def nproc() -> int:
    out = _command(["nproc"])
    if out and out.isdigit():
        return int(out)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version_in(text: str | None, pattern: str) -> str | None:
    match = re.search(pattern, text or "")
    return match.group(1) if match else None


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def collect(client: redis.Redis) -> dict[str, Any]:
    """Facts about this machine and about the Redis server `client` talks to."""
    try:
        server = client.info("server")
    except redis.RedisError:
        server = {}
    return {
        "nproc": nproc(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "redis_server": server.get("redis_version")
        or _version_in(_command(["redis-server", "--version"]), r"v=(\S+)"),
        "redis_server_local_binary": _version_in(
            _command(["redis-server", "--version"]), r"v=(\S+)"
        ),
        "redis_benchmark": _version_in(_command(["redis-benchmark", "--version"]), r"(\d+\.\S+)"),
        "redis_server_io_threads": server.get("io_threads_active"),
        "loadavg_start": loadavg(),
    }
