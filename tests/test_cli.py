"""`python -m redmutex status | list | release`, run as a subprocess against real redis-servers."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redmutex
from redmutex._server import RedisServer, free_port

SECRET = "Cl1-Secret-Pa55word"


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "redmutex", *args],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=environment,
        timeout=timeout,
    )


def cli_json(*args: str) -> tuple[int, Any]:
    done = run_cli(*args, "--json")
    assert done.stderr == "", done.stderr
    return done.returncode, json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess[str], start: str = "redmutex: error: ") -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(start), lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def name_() -> str:
    return f"n-{uuid.uuid4().hex[:8]}"


# -- status -----------------------------------------------------------------------------------


def test_status_of_a_held_lock(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    name = name_()
    with redmutex.Lock(client, name, ttl=30) as lock:
        assert lock.token is not None
        code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        assert data["held"] is True
        assert data["name"] == name and data["prefix"] == prefix
        assert data["lock"]["holder"] == lock.token[:8]  # a prefix only: never the whole token
        assert 20 < data["lock"]["remaining"] <= 30
        assert data["fence"] == lock.fence
        assert data["waiters"] == 0
        assert data["semaphore"] is None and data["rwlock"] is None and data["cache"] is None

        done = run_cli("status", name, "--redis", redis_url, "--prefix", prefix)
        assert done.returncode == 0, done.stderr
        assert f"held by {lock.token[:8]}..." in done.stdout
        assert lock.token not in done.stdout
        assert f"fence:     {lock.fence}" in done.stdout


def test_status_of_a_free_lock_and_of_nothing(
    redis_url: str, prefix: str, client: redmutex.Client
) -> None:
    name = name_()
    lock = redmutex.Lock(client, name)
    lock.acquire()
    fence = lock.fence
    lock.release()
    code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
    assert code == 1
    assert data["held"] is False and data["lock"] is None and data["fence"] == fence

    done = run_cli("status", "never-used", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 1, done.stderr
    assert "state:     free" in done.stdout
    assert "nothing is stored under this name" in done.stdout


def test_status_counts_the_fair_queue(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis
) -> None:
    name = name_()
    holder = redmutex.Lock(client, name, ttl=30, fair=True)
    holder.acquire()
    results: list[bool] = []

    def wait_for_it() -> None:
        waiter = redmutex.Lock(redmutex.Client(redis_url, prefix=prefix), name, ttl=5, fair=True)
        results.append(waiter.acquire(timeout=20))
        waiter.release()

    threads = [threading.Thread(target=wait_for_it) for _ in range(2)]
    for t in threads:
        t.start()
    deadlines = (prefix + "{" + name + "}:queue:deadlines").encode()
    try:
        wait_until(lambda: r.zcard(deadlines) == 2)
        code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        assert data["waiters"] == 2
    finally:
        holder.release()
        for t in threads:
            t.join(30)
    assert results == [True, True]


def test_status_of_semaphore_rwlock_and_cache(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis
) -> None:
    name = name_()
    sem = redmutex.Semaphore(client, name, 3, ttl=30)
    other = redmutex.Semaphore(client, name, 3, ttl=30)
    rw = redmutex.RWLock(client, name, ttl=30)
    reader = rw.read()
    with sem, other, reader:
        code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0 and data["held"] is True
        assert data["lock"] is None
        holders = {h["holder"] for h in data["semaphore"]["holders"]}
        assert holders == {sem.token[:8], other.token[:8]}  # type: ignore[index]
        assert data["semaphore"]["waiters"] == 0
        assert data["rwlock"]["writer"] is None
        assert [h["holder"] for h in data["rwlock"]["readers"]] == [reader.token[:8]]  # type: ignore[index]
    # Semaphore and readers released: their keys may stay, but nothing counts as held.
    code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
    assert code == 1

    writer = rw.write()
    with writer:
        code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        assert data["rwlock"]["writer"]["holder"] == writer.token[:8]  # type: ignore[index]

    base = prefix + "{" + name + "}"
    r.set(base + ":value", b"payload", px=60_000)
    code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
    assert code == 1  # a stored value is not a hold
    assert data["cache"]["stored"] is True and 50 < data["cache"]["remaining"] <= 60
    assert data["cache"]["filling"] is None
    r.set(base + ":fill", b"f" * 32, px=10_000)
    code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
    assert code == 0  # somebody holds the fill claim
    assert data["cache"]["filling"]["holder"] == "f" * 8
    done = run_cli("status", name, "--redis", redis_url, "--prefix", prefix)
    assert "cache:     stored" in done.stdout and "being filled by ffffffff..." in done.stdout


def test_status_reads_redis_url_from_the_environment(
    redis_url: str, prefix: str, client: redmutex.Client
) -> None:
    name = name_()
    with redmutex.Lock(client, name, ttl=30):
        done = run_cli("status", name, "--prefix", prefix, env={"REDIS_URL": redis_url})
        assert done.returncode == 0, done.stderr
    # --redis wins over the environment.
    done = run_cli(
        "status",
        name,
        "--prefix",
        prefix,
        "--redis",
        redis_url,
        env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
    )
    assert done.returncode == 1, done.stderr


def test_default_prefix(redis_url: str, r: redis.Redis) -> None:
    name = name_()
    with redmutex.Lock(redmutex.Client(redis_url), name, ttl=30):
        assert run_cli("status", name, "--redis", redis_url).returncode == 0
        assert run_cli("status", name, "--redis", redis_url, "--prefix", "x:").returncode == 1


# -- list -------------------------------------------------------------------------------------


def test_list_finds_every_kind_with_scan(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis
) -> None:
    odd = "we{i}rd:lock name"  # braces, a colon, a suffix-like part and a space
    held = redmutex.Lock(client, odd, ttl=30)
    held.acquire()
    free = redmutex.Lock(client, "free-one")
    free.acquire()
    free.release()
    sem = redmutex.Semaphore(client, "quota", 2, ttl=30)
    sem.acquire()
    reader = redmutex.RWLock(client, "config", ttl=30).read()
    reader.acquire()
    r.set(prefix + "{user:7}:value", b"x", px=60_000)
    # Not ours: another prefix, an unknown suffix, no braces.
    r.set("other:{x}:lock", b"t", px=60_000)
    r.set(prefix + "{x}:unknown", b"t", px=60_000)
    r.set(prefix + "plain", b"t", px=60_000)
    try:
        keys_before = _calls(r, "keys")
        scans_before = _calls(r, "scan")
        code, data = cli_json("list", "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        assert _calls(r, "keys") == keys_before  # never KEYS
        assert _calls(r, "scan") > scans_before
        found = {(e["name"], e["kind"]): e for e in data}
        # What is held or queued (and the stored cache value); an idle name only with --all.
        assert set(found) == {
            (odd, "lock"),
            ("quota", "semaphore"),
            ("config", "rwlock"),
            ("user:7", "cache"),
        }
        code, data = cli_json("list", "--all", "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        found = {(e["name"], e["kind"]): e for e in data}
        assert set(found) == {
            (odd, "lock"),
            ("free-one", "lock"),
            ("quota", "semaphore"),
            ("config", "rwlock"),
            ("user:7", "cache"),
        }
        assert found[(odd, "lock")]["held"] is True
        assert found[(odd, "lock")]["fence"] == held.fence
        assert found[("free-one", "lock")]["held"] is False
        assert found[("quota", "semaphore")]["holders"] == 1
        assert found[("config", "rwlock")]["readers"] == 1
        assert found[("user:7", "cache")]["stored"] is True

        done = run_cli("list", "--redis", redis_url, "--prefix", prefix)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["KIND", "NAME", "STATE"]
        assert any(line.startswith("lock") and odd in line and "held" in line for line in lines)
        assert any(line.startswith("semaphore") and "quota" in line for line in lines)
        assert not any("free-one" in line for line in lines)
        done = run_cli("list", "--all", "--redis", redis_url, "--prefix", prefix)
        assert any(
            "free-one" in line and "free, fence" in line for line in done.stdout.splitlines()
        )
    finally:
        held.release()
        sem.release()
        reader.release()
        r.delete("other:{x}:lock")


def test_list_of_an_empty_prefix(redis_url: str, prefix: str) -> None:
    done = run_cli("list", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert "nothing under the prefix" in done.stdout
    assert cli_json("list", "--redis", redis_url, "--prefix", prefix) == (0, [])
    assert cli_json("list", "--all", "--redis", redis_url, "--prefix", prefix) == (0, [])


def test_list_escapes_glob_characters_in_the_prefix(redis_url: str) -> None:
    star = f"s*{uuid.uuid4().hex[:6]}:"
    other = star.replace("*", "X")
    with (
        redmutex.Lock(redmutex.Client(redis_url, prefix=star), "a", ttl=30),
        redmutex.Lock(redmutex.Client(redis_url, prefix=other), "b", ttl=30),
    ):
        code, data = cli_json("list", "--redis", redis_url, "--prefix", star)
    assert code == 0
    assert [e["name"] for e in data] == ["a"]


@pytest.mark.timeout(120)
def test_list_and_status_stay_fast_and_small_with_names_of_megabytes(
    redis_url: str, prefix: str, r: redis.Redis, tmp_path: Any
) -> None:
    # Names may be as long as the server takes: three of 1-10 MB among 130 entries once made the
    # text output pad every row to the longest name (1.3 GB written, 29 s).
    huge = {
        "a" * 1_000_000: "lock",
        "b" * 4_000_000 + "\n" + "tail": "fence",
        "c" * 10_000_000: "value",
    }
    pipe = r.pipeline(transaction=False)
    for i in range(127):
        pipe.set(f"{prefix}{{small-{i:03}}}:lock".encode(), b"t" * 32, px=60_000)
    for name, suffix in huge.items():
        pipe.set(f"{prefix}{{{name}}}:{suffix}".encode(), b"7", px=60_000)
    pipe.execute()
    try:
        out = tmp_path / "list.txt"
        started = time.monotonic()
        with out.open("wb") as sink:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "redmutex",
                    "list",
                    "--redis",
                    redis_url,
                    "--prefix",
                    prefix,
                ],
                check=False,
                stdout=sink,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                timeout=100,
            )
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert took < 15, f"list took {took:.1f} s"
        assert out.stat().st_size < 64_000, out.stat().st_size
        lines = out.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 1 + 130  # a name with a newline is still one row
        assert max(len(line) for line in lines) < 200
        assert sum("small-" in line for line in lines) == 127
        assert any("aaaa" in line and "1000000 chars" in line and "held" in line for line in lines)
        assert any("bbbb" in line and "fence 7" in line for line in lines)
        assert any("cccc" in line and "stored" in line for line in lines)

        # --json keeps every name whole.
        started = time.monotonic()
        code, data = cli_json("list", "--redis", redis_url, "--prefix", prefix)
        assert code == 0 and time.monotonic() - started < 30
        assert {e["name"] for e in data} >= set(huge)

        # status of a long name (as long as a command line allows) shortens it in text only.
        long_name = "d" * 100_000
        r.set(f"{prefix}{{{long_name}}}:lock".encode(), b"x" * 32, px=60_000)
        text = run_cli("status", long_name, "--redis", redis_url, "--prefix", prefix)
        assert text.returncode == 0, text.stderr
        assert len(text.stdout) < 2_000 and "100000 chars" in text.stdout
        code, status = cli_json("status", long_name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0 and status["name"] == long_name
    finally:
        for key in r.scan_iter(match=prefix + "*", count=1000):
            r.delete(key)


def _calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


# -- release ----------------------------------------------------------------------------------


def test_release_needs_force(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    name = name_()
    with redmutex.Lock(client, name, ttl=30) as lock:
        line = one_line_error(run_cli("release", name, "--redis", redis_url, "--prefix", prefix))
        assert "--force" in line
        assert lock.owned()


def test_release_force_deletes_and_wakes_waiters(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis
) -> None:
    name = name_()
    holder = redmutex.Lock(client, name, ttl=60)
    holder.acquire()
    fence = holder.fence
    woke: list[float] = []

    def waiter() -> None:
        lock = redmutex.Lock(redmutex.Client(redis_url, prefix=prefix), name, ttl=5)
        if lock.acquire(timeout=30):
            woke.append(time.monotonic())
            lock.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # the waiter is waiting (its first attempt failed)
    started = time.monotonic()
    code, data = cli_json("release", name, "--force", "--redis", redis_url, "--prefix", prefix)
    thread.join(30)
    assert code == 0
    assert data == {"name": name, "released": True, "holder": holder.token[:8]}  # type: ignore[index]
    # Woken by the release's message, not by the 60 s lease running out.
    assert woke and woke[0] - started < 10
    assert int(r.get((prefix + "{" + name + "}:fence").encode()) or 0) > (fence or 0)
    with pytest.raises(redmutex.LockLostError):
        holder.release()


def test_release_force_of_a_free_lock(redis_url: str, prefix: str) -> None:
    done = run_cli("release", "free", "--force", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 1, done.stderr
    assert "not released: it is not held" in done.stdout


def _release_on_a_terminal(
    args: list[str], answer: bytes, timeout: float = 30.0
) -> tuple[int, str]:
    """Runs the CLI with a pseudo-terminal as stdin (and stderr), answering its question."""
    controller, terminal = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "redmutex", *args],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=environment,
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + timeout
        while b"[y/N]" not in seen:
            assert time.monotonic() < deadline, f"no question asked: {seen!r}"
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(controller, 1024)
                except OSError:
                    break
        os.write(controller, answer)
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        os.close(controller)
    return proc.returncode, seen.decode() + stdout.decode()


def test_release_asks_on_a_terminal(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    name = name_()
    lock = redmutex.Lock(client, name, ttl=60)
    lock.acquire()
    args = ["release", name, "--force", "--redis", redis_url, "--prefix", prefix]
    code, output = _release_on_a_terminal(args, b"n\n")
    assert code == 1, output
    assert f"held by {lock.token[:8]}..." in output  # type: ignore[index]
    assert "not confirmed" in output
    assert lock.owned()

    code, output = _release_on_a_terminal(args, b"y\n")
    assert code == 0, output
    assert "released lock" in output
    assert not lock.owned()


def test_release_yes_skips_the_question(
    redis_url: str, prefix: str, client: redmutex.Client
) -> None:
    name = name_()
    lock = redmutex.Lock(client, name, ttl=60)
    lock.acquire()
    done = run_cli("release", name, "--force", "--yes", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert f"released lock {name!r} (held by {lock.token[:8]}...)" in done.stdout  # type: ignore[index]
    assert not lock.locked()


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status", "x"], ["list"], ["release", "x", "--force"]])
def test_unreachable_redis_is_one_line_without_the_password(command: list[str]) -> None:
    url = f"redis://alice:{SECRET}@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    line = one_line_error(run_cli(*command, "--redis", url))
    assert time.monotonic() - started < 20
    assert "cannot reach Redis at redis://alice:***@127.0.0.1:" in line
    assert SECRET not in line


def test_password_in_the_environment_is_not_shown() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    done = run_cli("status", "x", env={"REDIS_URL": url})
    line = one_line_error(done)
    assert SECRET not in done.stderr + done.stdout
    assert "***" in line


@pytest.mark.parametrize(
    "url",
    [
        f"http://u:{SECRET}@127.0.0.1:6379/0",
        f"redis://u:{SECRET}@127.0.0.1:notaport/0",
        f"unix:///tmp/none.sock?pass={SECRET}&db=x",
    ],
)
def test_bad_urls_are_one_line_without_the_password(url: str) -> None:
    done = run_cli("status", "x", "--redis", url)
    one_line_error(done)
    assert SECRET not in done.stderr + done.stdout


def test_credentials(make_server: Callable[..., RedisServer]) -> None:
    server = make_server(["--requirepass", SECRET])
    good = f"redis://:{SECRET}@127.0.0.1:{server.port}/0"
    bad = f"redis://:wrong-{SECRET}@127.0.0.1:{server.port}/0"
    assert run_cli("status", "x", "--redis", good).returncode == 1
    done = run_cli("status", "x", "--redis", bad)
    line = one_line_error(done)
    assert "refused the credentials" in line
    assert SECRET not in done.stderr


def test_unix_socket_urls(
    make_server: Callable[..., RedisServer], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = make_server(["--unixsocket", path, "--unixsocketperm", "700", "--requirepass", SECRET])
    tcp = redmutex.Client(f"redis://:{SECRET}@127.0.0.1:{server.port}/3")
    with redmutex.Lock(tcp, "sock", ttl=30):
        for url in (
            f"unix://{path}?db=3&pass={SECRET}",
            f"redis+unix://{path}?db=3&pass={SECRET}",
        ):
            done = run_cli("status", "sock", "--redis", url)
            assert done.returncode == 0, done.stderr
        # Another db: nothing there.
        assert run_cli("status", "sock", "--redis", f"unix://{path}?pass={SECRET}").returncode == 1


def test_without_redis_py_the_error_says_what_to_install(redis_url: str) -> None:
    script = (
        "import sys; sys.modules['redis'] = None\n"
        "from redmutex.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "status", "x", "--redis", redis_url],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    line = one_line_error(done)
    assert "redis-py" in line and "pip install" in line


def test_usage_errors_are_one_line() -> None:
    usage = "python -m redmutex status: error: "
    assert "NAME" in one_line_error(run_cli("status"), usage)
    assert "--bogus" in one_line_error(run_cli("status", "x", "--bogus"), "python -m redmutex")
    done = run_cli("status", "", "--redis", "redis://127.0.0.1:1/0")
    assert "name: must not be empty" in one_line_error(done)
