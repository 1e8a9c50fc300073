"""`python -m redmutex demo` cleans up after itself, however it ends (an audit found each of
these): its private redis-server's temporary directory was left after every run; SIGTERM or
SIGHUP left the private redis-server running for good (it runs in a session of its own); a
Ctrl-C while the worker processes started kept it silent for 10-30 s; and `--redis` read a raw
password URL with redis-py's parser, which took part of the password for the host and printed
it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redmutex._demos import transfers
from redmutex._server import RedisServer


def _demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """The demo in a session of its own (so a signal to its group reaches nothing else), its
    temporary files under `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONUNBUFFERED"] = "1"  # its lines as they are printed
    return subprocess.Popen(
        [sys.executable, "-m", "redmutex", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )


def _servers_under(tmp_path: Path) -> list[int]:
    """PIDs of the redis-servers working in a directory under `tmp_path` (a server chdirs to
    its `--dir`; its command line shows only its address)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if name.startswith("redis-server") and cwd.startswith(str(tmp_path)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def no_server_left(tmp_path: Path) -> Iterator[Callable[[], list[int]]]:
    """Stops (and reports) any redis-server the demo left under `tmp_path`."""
    yield lambda: _servers_under(tmp_path)
    for pid in _servers_under(tmp_path):
        os.kill(pid, signal.SIGKILL)


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_termination_that_python_dropped_still_ends_the_wait() -> None:
    """A SIGTERM that lands while the main thread runs a callback (an import's module-lock
    weakref callback, as once seen: the demo then ran on for minutes) raises its SystemExit
    there, and Python only prints it. The wait for the workers' results ends the demo anyway."""
    results: queue.Queue[tuple[object, ...]] = queue.Queue()
    with transfers._cleaned_up_on_termination():
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)

        class Anchor:
            pass

        anchor = Anchor()
        dropped = weakref.ref(anchor, lambda _: handler(signal.SIGTERM, None))
        del anchor  # the callback runs and raises; Python prints the SystemExit and drops it
        assert dropped() is None
        started = time.monotonic()
        with pytest.raises(SystemExit) as ended:
            transfers._drain(results, 1, deadline=time.monotonic() + 30)
        assert ended.value.code == 128 + signal.SIGTERM
        assert time.monotonic() - started < 5


@pytest.mark.timeout(180)
def test_a_finished_demo_leaves_no_temporary_directory(tmp_path: Path) -> None:
    demo = _demo(tmp_path, "--processes", "2", "--transfers", "20")
    out, _ = demo.communicate(timeout=150)
    assert demo.returncode == 0, out
    assert list(tmp_path.glob("redmutex-redis-*")) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminated_demo_stops_its_private_server(
    tmp_path: Path, no_server_left: Callable[[], list[int]], sig: signal.Signals
) -> None:
    demo = _demo(tmp_path, "--processes", "2", "--transfers", "100000")
    try:
        _wait_for(lambda: no_server_left() != [], 30, "the private redis-server")
        os.kill(demo.pid, sig)  # the demo alone, as `kill` does
        demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
    assert demo.returncode == 128 + sig
    assert no_server_left() == []
    assert list(tmp_path.glob("redmutex-redis-*")) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay", [0.5, 1.0, 1.5, 2.0])
def test_ctrl_c_while_the_workers_start_ends_the_demo_at_once(
    tmp_path: Path, no_server_left: Callable[[], list[int]], delay: float
) -> None:
    demo = _demo(tmp_path, "--processes", "6", "--transfers", "300")
    assert demo.stdout is not None
    try:
        header = demo.stdout.readline()  # printed just before the workers are started
        assert "processes x" in header, header
        time.sleep(delay)  # the workers are being spawned (each imports redmutex) or wait
        os.killpg(demo.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
        interrupted = time.monotonic()
        demo.communicate(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
    assert demo.returncode == 130
    assert took < 8, f"the demo took {took:.1f} s to end after Ctrl-C"
    assert no_server_left() == []


def test_a_raw_password_url_is_read_as_the_client_reads_it(
    make_server: Callable[..., RedisServer], tmp_path: Path
) -> None:
    password = "Zq9@Sec/ret"
    server = make_server(extra_args=["--requirepass", password])
    url = f"redis://:{password}@127.0.0.1:{server.port}/0"
    demo = _demo(tmp_path, "--redis", url, "--processes", "2", "--transfers", "20")
    out, _ = demo.communicate(timeout=150)
    assert demo.returncode == 0, out.replace(password, "***")
    assert f"127.0.0.1:{server.port}" in out
    assert password not in out and "sec:6379" not in out.lower()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_a_reader_that_goes_away_ends_the_demo_quietly(
    tmp_path: Path, no_server_left: Callable[[], list[int]], unbuffered: str
) -> None:
    # `demo | head -1`: the demo stopped with exit 2 and "BrokenPipeError" on stderr. As for
    # status and list, a reader gone is not an error: it ends quietly, as a writer that SIGPIPE
    # killed (141), and still stops its private redis-server.
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONUNBUFFERED")}
    env["TMPDIR"] = str(tmp_path)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    demo = subprocess.Popen(
        [sys.executable, "-m", "redmutex", "demo", "--processes", "1", "--transfers", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert demo.stdout is not None and demo.stderr is not None
    try:
        assert "processes x" in demo.stdout.readline()
        demo.stdout.close()  # as `head -1` does after its line
        demo.wait(timeout=90)
        errors = demo.stderr.read()
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
        demo.stderr.close()
    assert (demo.returncode, errors) == (141, ""), errors
    assert no_server_left() == []
    assert list(tmp_path.glob("redmutex-redis-*")) == []
