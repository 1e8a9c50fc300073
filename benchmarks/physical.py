"""The physical limit: how many round trips one connection gets, measured with redis-benchmark.

An acquire+release pair is at least one `SET NX PX` and one `EVALSHA` round trip, so

    pair limit = 1 / (1 / rps_set + 1 / rps_evalsha)   pairs/s

is what a single connection can do at best; a lock library can only approach it from below.

redis-benchmark's client is an event loop (epoll, then read and write), which on some machines
(VMs where a system call is dear) costs more per request than a client that writes and then
blocks in read(). So the same two commands are also timed over a plain blocking socket
(`raw_socket`): the tighter of the two references, reported beside it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from redis.connection import parse_url
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
    raw_set_rps: float | None = None  # the same commands over a blocking socket (raw_socket)
    raw_evalsha_rps: float | None = None

    @property
    def pair_limit(self) -> float:
        return pair_limit(self.set_rps, self.evalsha_rps)

    @property
    def raw_pair_limit(self) -> float | None:
        if not self.raw_set_rps or not self.raw_evalsha_rps:
            return None
        return pair_limit(self.raw_set_rps, self.raw_evalsha_rps)

    def as_dict(self) -> dict[str, Any]:
        raw = self.raw_pair_limit
        return {
            **asdict(self),
            "pair_limit": round(self.pair_limit, 1),
            "raw_pair_limit": None if raw is None else round(raw, 1),
        }


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


def resp(*args: str) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def blocking_socket(target: Target) -> socket.socket | None:
    """A blocking socket to the target (TCP_NODELAY on TCP), authenticated and on its database;
    None for TLS, which would need more than a socket."""
    if target.url.startswith("rediss://"):
        return None
    kwargs = parse_url(target.url)
    if "path" in kwargs:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(kwargs["path"]))
    else:
        address = (str(kwargs.get("host", "127.0.0.1")), int(kwargs.get("port", 6379)))
        sock = socket.create_connection(address, timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    setup = []
    if kwargs.get("password"):
        user = kwargs.get("username")
        pw = str(kwargs["password"])
        setup.append(resp("AUTH", str(user), pw) if user else resp("AUTH", pw))
    if kwargs.get("db"):
        setup.append(resp("SELECT", str(kwargs["db"])))
    for message in setup:
        sock.sendall(message)
        if not sock.recv(4096).startswith(b"+OK"):
            sock.close()
            raise RuntimeError("raw socket: AUTH/SELECT refused")
    return sock


def raw_socket(target: Target, requests: int, command: list[str]) -> float | None:
    """Requests/s of `command` sent one at a time over a blocking TCP_NODELAY socket (None for
    TLS, which would need more than a socket)."""
    sock = blocking_socket(target)
    if sock is None:
        return None
    with sock:
        payload = resp(*command)
        send, recv = sock.sendall, sock.recv
        for _ in range(min(1000, requests)):  # warm-up
            send(payload)
            recv(4096)  # every reply of these commands fits one small read
        start = time.perf_counter()
        for _ in range(requests):
            send(payload)
            if not recv(4096):
                raise RuntimeError("raw socket: the server closed the connection")
        return requests / (time.perf_counter() - start)


def limit_commands(sha: str, key_prefix: str) -> tuple[bytes, bytes]:
    """The two requests of the blocking-socket pair (`interleaved.py` sends them in turn)."""
    set_cmd = resp("SET", f"{key_prefix}:set", "v", "NX", "PX", "10000")
    eval_cmd = resp("EVALSHA", sha, "1", f"{key_prefix}:evalsha", "v", "10000")
    return set_cmd, eval_cmd


def measure(target: Target, requests: int, when: str, key_prefix: str) -> PhysicalLimit:
    """Time `SET k v NX PX 10000` and an EVALSHA doing the same, on one connection each."""
    client = target.redis()
    try:
        sha = client.script_load(SET_NX_PX_SCRIPT)
    finally:
        client.close()
    set_key, eval_key = f"{key_prefix}:set", f"{key_prefix}:evalsha"
    set_rps, set_p50 = _run_benchmark(target, requests, ["SET", set_key, "v", "NX", "PX", "10000"])
    eval_command = ["EVALSHA", sha, "1", eval_key, "v", "10000"]
    eval_rps, eval_p50 = _run_benchmark(target, requests, eval_command)
    raw_requests = max(1000, requests // 2)
    raw_set = raw_socket(target, raw_requests, ["SET", set_key, "v", "NX", "PX", "10000"])
    raw_eval = raw_socket(target, raw_requests, eval_command)
    return PhysicalLimit(when, requests, set_rps, eval_rps, set_p50, eval_p50, raw_set, raw_eval)
