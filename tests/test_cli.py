"""`python -m redmutex status | list | release`, run as a subprocess against real redis-servers."""

from __future__ import annotations

import json
import os
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
from _cli_run import cli_json, release_on_a_terminal, run_cli
from redmutex._server import RedisServer, free_port

SECRET = "Cl1-Secret-Pa55word"


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


@pytest.mark.parametrize("fair", [True, False])
def test_status_counts_the_queue(
    redis_url: str, prefix: str, client: redmutex.Client, r: redis.Redis, fair: bool
) -> None:
    """An unfair lock's blocking waiters queue too (the text said "in the fair queue")."""
    name = name_()
    holder = redmutex.Lock(client, name, ttl=30, fair=fair)
    holder.acquire()
    results: list[bool] = []

    def wait_for_it() -> None:
        waiter = redmutex.Lock(redmutex.Client(redis_url, prefix=prefix), name, ttl=5, fair=fair)
        results.append(waiter.acquire(timeout=20))
        waiter.release()

    threads = [threading.Thread(target=wait_for_it) for _ in range(2)]
    for t in threads:
        t.start()
    places = (prefix + "{" + name + "}:lock:queue").encode()
    try:
        wait_until(lambda: r.hlen(places) == 2)
        code, data = cli_json("status", name, "--redis", redis_url, "--prefix", prefix)
        assert code == 0
        assert data["waiters"] == 2
        done = run_cli("status", name, "--redis", redis_url, "--prefix", prefix)
        assert "waiting:   2 in the queue" in done.stdout.splitlines(), done.stdout
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
                    "--all",  # the "bbbb" name holds only a fence counter: an idle name
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
        code, data = cli_json("list", "--all", "--redis", redis_url, "--prefix", prefix)
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
    assert data["released"] is True and data["holder"] == holder.token[:8]  # type: ignore[index]
    assert data["semaphore_holders"] == 0 and data["readers"] == 0
    assert data["writer"] is None and data["fill"] is None
    # Woken by the release's message, not by the 60 s lease running out.
    assert woke and woke[0] - started < 10
    assert int(r.get((prefix + "{" + name + "}:fence").encode()) or 0) > (fence or 0)
    with pytest.raises(redmutex.LockLostError):
        holder.release()


def test_release_force_of_a_free_lock(redis_url: str, prefix: str) -> None:
    done = run_cli("release", "free", "--force", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 1, done.stderr
    assert "not released: it is not held" in done.stdout


def test_release_asks_on_a_terminal(redis_url: str, prefix: str, client: redmutex.Client) -> None:
    name = name_()
    lock = redmutex.Lock(client, name, ttl=60)
    lock.acquire()
    args = ["release", name, "--force", "--redis", redis_url, "--prefix", prefix]
    code, output = release_on_a_terminal(args, b"n\n")
    assert code == 1, output
    assert f"held by {lock.token[:8]}..." in output  # type: ignore[index]
    assert "not confirmed" in output
    assert lock.owned()

    code, output = release_on_a_terminal(args, b"y\n")
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


# -- the console script and --version ---------------------------------------------------------


def test_version_from_the_console_script_and_python_m() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"redmutex {redmutex.__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "redmutex")
    assert os.access(script, os.X_OK), f"no console script at {script}"
    done = subprocess.run(
        [script, "--version"], check=False, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"redmutex {redmutex.__version__}"
    usage = subprocess.run(
        [script, "status", "--help"], check=False, capture_output=True, text=True, timeout=30
    )
    assert usage.returncode == 0 and usage.stdout.startswith("usage: redmutex status ")
    assert "--cluster" in usage.stdout and "redis+sentinel://" in usage.stdout


# -- release --force of every kind of hold ----------------------------------------------------


def test_release_force_frees_semaphore_rwlock_and_fill_claim_and_wakes_their_waiters(
    redis_url: str, prefix: str, client: redmutex.Client
) -> None:
    name = name_()
    holders = [redmutex.Semaphore(client, name, 2, ttl=60) for _ in range(2)]
    for sem in holders:
        assert sem.acquire(timeout=5)
    rw = redmutex.RWLock(client, name, ttl=60)
    readers = [rw.read() for _ in range(3)]
    for reader in readers:
        assert reader.acquire(timeout=5)
    filling = threading.Event()
    finish = threading.Event()

    def slow_fill() -> str:
        filling.set()
        finish.wait(30)
        return "first"

    woke: dict[str, float] = {}

    def in_thread(what: str, job: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            if job():
                woke[what] = time.monotonic()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    other = redmutex.Client(redis_url, prefix=prefix)
    first_fill = in_thread(
        "first fill", lambda: redmutex.get_or_fill(client, name, slow_fill, ttl=60, lock_ttl=60)
    )
    assert filling.wait(10)
    threads = [
        in_thread(
            "semaphore", lambda: redmutex.Semaphore(other, name, 2, ttl=5).acquire(timeout=30)
        ),
        in_thread(
            "writer", lambda: redmutex.RWLock(other, name, ttl=5).write().acquire(timeout=30)
        ),
        in_thread(
            "cache",
            lambda: (
                redmutex.get_or_fill(other, name, lambda: "second", ttl=60, lock_ttl=60, timeout=30)
                == "second"
            ),
        ),
    ]
    time.sleep(0.5)  # every waiter has made its first attempt and waits
    started = time.monotonic()
    code, data = cli_json(
        "release", name, "--force", "--yes", "--redis", redis_url, "--prefix", prefix
    )
    assert code == 0
    assert data["released"] is True and data["holder"] is None
    assert data["semaphore_holders"] == 2 and data["readers"] == 3 and data["writer"] is None
    assert data["fill"] is not None
    for thread in threads:
        thread.join(30)
    finish.set()
    first_fill.join(30)
    # Woken by the forced release's message, not by the 60 s leases running out.
    for what in ("semaphore", "writer", "cache"):
        assert what in woke and woke[what] - started < 15, (what, woke)
    for sem in holders:
        with pytest.raises(redmutex.LockLostError):
            sem.release()


def test_release_force_says_what_it_freed(
    redis_url: str, prefix: str, client: redmutex.Client
) -> None:
    name = name_()
    sems = [redmutex.Semaphore(client, name, 5, ttl=60) for _ in range(3)]
    for sem in sems:
        assert sem.acquire(timeout=5)
    writer = redmutex.RWLock(client, name, ttl=60).write()
    assert writer.acquire(timeout=5)
    done = run_cli("release", name, "--force", "-y", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert f"freed semaphore {name!r}: 3 holders" in done.stdout
    assert f"freed rwlock {name!r}: writer {writer.token[:8]}..." in done.stdout  # type: ignore[index]
    assert "waiters woken" in done.stdout
    done = run_cli("release", name, "--force", "-y", "--redis", redis_url, "--prefix", prefix)
    assert done.returncode == 1 and "not released: it is not held" in done.stdout


# -- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status", "x"], ["list"], ["release", "x", "--force", "-y"]])
def test_authentication_required_and_wrong_password(
    make_server: Callable[..., RedisServer], command: list[str]
) -> None:
    server = make_server(["--requirepass", SECRET])
    line = one_line_error(run_cli(*command, "--redis", f"redis://127.0.0.1:{server.port}/0"))
    assert "authentication required" in line, line
    assert "HELLO" not in line
    done = run_cli(*command, "--redis", f"redis://:wrong-{SECRET}@127.0.0.1:{server.port}/0")
    line = one_line_error(done)
    assert "refused the credentials: wrong password or user" in line, line
    assert SECRET not in done.stderr + done.stdout


# -- every URL form: Redlock lists, Redis Cluster seeds, Sentinel -----------------------------


def test_redlock_lists(make_server: Callable[..., RedisServer]) -> None:
    servers = [make_server() for _ in range(3)]
    urls = [s.url for s in servers]
    client = redmutex.Client(urls, prefix="rl:")
    name = name_()
    lock = redmutex.Lock(client, name, ttl=60)
    assert lock.acquire(timeout=5)
    comma = ["--redis", ",".join(urls), "--prefix", "rl:"]
    repeated = [a for u in urls for a in ("--redis", u)] + ["--prefix", "rl:"]
    for form in (comma, repeated):
        code, data = cli_json("status", name, *form)
        assert code == 0, data
        assert data["held"] is True and data["held_on"] == 3 and data["quorum"] == 2
        assert [m["lock"]["holder"] for m in data["masters"]] == [lock.token[:8]] * 3  # type: ignore[index]
    code, rows = cli_json("list", *comma)
    assert code == 0 and sorted(r["master"] for r in rows if r["name"] == name) == sorted(
        redmutex.Client(u).url for u in urls
    )
    done = run_cli("release", name, "--force", "-y", *repeated)
    assert done.returncode == 0, done.stderr
    assert "released lock" in done.stdout and "on 3 of 3 masters" in done.stdout
    assert not lock.locked()
    code, data = cli_json("status", name, *comma)
    assert code == 1 and data["held"] is False


def test_redlock_release_on_a_terminal_with_a_master_down(
    make_server: Callable[..., RedisServer],
) -> None:
    # Asking reads each master's holder: a master that is down is left out there, as the
    # release itself (and `--yes`) leaves it out, instead of ending the command with exit 2.
    servers = [make_server() for _ in range(3)]
    urls = [s.url for s in servers]
    name = name_()
    lock = redmutex.Lock(redmutex.Client(urls, prefix="rt:"), name, ttl=60)
    assert lock.acquire(timeout=5)
    servers[2].stop()
    args = ["release", name, "--force", "--redis", ",".join(urls), "--prefix", "rt:"]
    code, output = release_on_a_terminal(args, b"y\n")
    assert code == 0, output
    assert f"held by {lock.token[:8]}..." in output  # type: ignore[index]
    assert "released lock" in output and "on 2 of 3 masters" in output, output
    for server in servers[:2]:
        assert redmutex.Lock(redmutex.Client(server.url, prefix="rt:"), name).locked() is False


def test_redlock_status_is_an_error_when_too_few_masters_answer(
    make_server: Callable[..., RedisServer],
) -> None:
    # Held on all three, then two stop: the one that answers cannot say "free" for the others
    # (a script doing `status NAME || start_job` must not go ahead).
    servers = [make_server() for _ in range(3)]
    urls = [s.url for s in servers]
    name = name_()
    lock = redmutex.Lock(redmutex.Client(urls, prefix="rq:"), name, ttl=60)
    assert lock.acquire(timeout=5)
    for server in servers[1:]:
        server.stop()
    comma = ["--redis", ",".join(urls), "--prefix", "rq:"]
    done = run_cli("status", name, *comma, "--json")
    assert done.returncode == 2, (done.stdout, done.stderr)
    data = json.loads(done.stdout)
    assert data["held"] is None and data["held_on"] == 1 and data["free_on"] == 0
    done = run_cli("status", name, *comma)
    assert done.returncode == 2 and "unknown" in done.stdout, done.stdout
    # Like every error, it says so in one line on stderr (with or without --json).
    for extra in ([], ["--json"]):
        line = one_line_error(run_cli("status", name, *comma, *extra))
        assert "cannot tell whether it is held: held on 1, free on 0 of 3 masters" in line, line
        assert "cannot reach Redis" in line, line


def test_cluster_seeds() -> None:
    from _scale_servers import Cluster

    with Cluster(3) as cluster:
        client = redmutex.Client(cluster=cluster.urls, prefix="c:")
        names = [name_() for _ in range(6)]  # spread over the three masters' slots
        sems = [redmutex.Semaphore(client, n, 2, ttl=60) for n in names]
        for sem in sems:
            assert sem.acquire(timeout=5)
        seeds = ["--cluster", ",".join(cluster.urls[:2]), "--prefix", "c:"]
        code, data = cli_json("status", names[0], *seeds)
        assert code == 0 and data["semaphore"]["holders"][0]["holder"] == sems[0].token[:8]  # type: ignore[index]
        code, rows = cli_json("list", *seeds)
        assert code == 0 and sorted(r["name"] for r in rows) == sorted(names)
        assert all(r["holders"] == 1 for r in rows)
        for name in names:
            done = run_cli(
                "release", name, "--force", "-y", "--cluster", cluster.urls[2], "--prefix", "c:"
            )
            assert done.returncode == 0, done.stderr
            assert f"freed semaphore {name!r}: 1 holder" in done.stdout
        code, rows = cli_json("list", *seeds)
        assert (code, rows) == (0, [])  # nothing held any more
        line = one_line_error(
            run_cli("list", "--cluster", cluster.urls[0], "--redis", cluster.urls[0])
        )
        assert "either --redis or --cluster" in line
        # One node given as --redis: a clear pointer to --cluster, for a name on another
        # node's slot and for a list that would show one node's share.
        held = redmutex.Lock(client, name_(), ttl=60)
        assert held.acquire(timeout=5)
        for url in cluster.urls:
            for argv in (("status", held.name), ("list",)):
                done = run_cli(*argv, "--redis", url, "--prefix", "c:")
                if done.returncode != 2:  # the name's own node answers `status`
                    assert argv[0] == "status" and done.returncode == 0, done.stderr
                    continue
                assert "is a Redis Cluster node" in one_line_error(done)
                assert "--cluster" in one_line_error(done)
        held.release()


def test_sentinel_url() -> None:
    from _scale_servers import SentinelGroup

    with SentinelGroup() as group:
        client = redmutex.Client(group.url, prefix="s:")
        name = name_()
        lock = redmutex.Lock(client, name, ttl=60)
        assert lock.acquire(timeout=10)
        code, data = cli_json("status", name, "--redis", group.url, "--prefix", "s:")
        assert code == 0 and data["lock"]["holder"] == lock.token[:8]  # type: ignore[index]
        code, rows = cli_json("list", "--redis", group.url, "--prefix", "s:")
        assert code == 0 and [r["name"] for r in rows] == [name]
        done = run_cli("release", name, "--force", "-y", "--redis", group.url, "--prefix", "s:")
        assert done.returncode == 0, done.stderr
        assert not lock.locked()


@pytest.mark.parametrize("option", ["--cluster", "--redis"])
def test_unreachable_cluster_or_redlock_is_one_line_without_the_password(option: str) -> None:
    urls = ",".join(f"redis://:{SECRET}@127.0.0.1:{free_port()}/0" for _ in range(3))
    if option == "--cluster":
        urls = urls.replace("/0", "")
    done = run_cli("list", option, urls)
    line = one_line_error(done)
    assert "cannot reach Redis" in line and "***" in line, line
    assert SECRET not in done.stderr + done.stdout


def test_shown_names_with_control_characters_never_read_like_printable_ones() -> None:
    """A name holding NUL was shown as `nul\\x00x`, the same as the printable name that spells
    the escape (audit): it is now quoted as Python writes it."""
    from redmutex._cli import shown_name

    assert shown_name("plain name") == "plain name"
    assert shown_name("nul\\x00x") == "nul\\x00x"
    assert shown_name("nul\0x") == "'nul\\x00x'"
    assert shown_name("a\nb") == "'a\\nb'"
    assert shown_name("\n" + "x" * 100, 30) == "'\\n" + "x" * 12 + "... (101 chars)"
