"""`python -m redmutex status` and the interactive `release --force` of an RWLock held by nobody
whose dead waiting writer's place still holds new readers back (writer preference; the place
lasts the writer's ttl, 1 s to 6 s). `status` said only "free", so a user asking why a reader
cannot get in was told that nothing is there (`list` said "1 writer waiting" without what that
does to readers); `release --force` on a terminal said "nothing is
held under this name" and left the place, which `--yes` drops."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import redmutex
from _cli_run import cli_json, release_on_a_terminal, run_cli
from _rw_dead_writer import leave_a_dead_waiting_writer

if TYPE_CHECKING:
    from conftest import PyProcs

PLACE_MAX = 6.0  # a waiting writer's place lasts its ttl, at most 6 s


def test_status_reports_the_waiting_writers_place_that_holds_readers_back(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
    procs: PyProcs,
    redis_url: str,
    prefix: str,
) -> None:
    name = "status-waiting-writer"
    leave_a_dead_waiting_writer(client, r, key_of, procs, redis_url, prefix, name)
    where = ("--redis", redis_url, "--prefix", prefix)

    done = run_cli("status", name, *where)
    assert done.returncode == 1, (done.stdout, done.stderr)  # nobody holds it
    state = next(line for line in done.stdout.splitlines() if line.startswith("state:"))
    assert "new readers are held back" in state, done.stdout
    lapses = re.search(r"1 writer waits \(its place lapses in ([0-9.]+) s", state)
    assert lapses is not None, done.stdout
    assert 0 < float(lapses.group(1)) <= PLACE_MAX
    assert re.search(r"writers waiting 1: [0-9a-f]{8}\.\.\. \([0-9.]+ s left\)", done.stdout), (
        done.stdout
    )

    code, data = cli_json("status", name, *where)
    assert code == 1 and data["held"] is False
    assert data["rwlock"]["writers_waiting"] == 1
    [place] = data["rwlock"]["writer_places"]
    assert re.fullmatch(r"[0-9a-f]{8}", place["holder"]), place
    assert 0 < place["remaining"] <= PLACE_MAX

    # `list` says it too, on the entry's one line.
    listed = run_cli("list", *where)
    [line] = [ln for ln in listed.stdout.splitlines() if name in ln]
    assert "0 readers, 1 writer waiting (new readers held back)" in line, listed.stdout


def test_release_on_a_terminal_offers_to_drop_the_waiting_writers_place(
    client: redmutex.Client,
    r: redis.Redis,
    key_of: Callable[[str, str], bytes],
    procs: PyProcs,
    redis_url: str,
    prefix: str,
) -> None:
    name = "release-waiting-writer"
    leave_a_dead_waiting_writer(client, r, key_of, procs, redis_url, prefix, name)
    args = ["release", name, "--force", "--redis", redis_url, "--prefix", prefix]

    # One run (the place lapses within seconds): the question, answered yes, and the outcome.
    code, output = release_on_a_terminal(args, b"y\n")
    assert "nothing is held" not in output, output
    assert f"Release 1 waiting writer place of rwlock {name!r}" in output, output
    assert code == 0, output
    assert f"dropped 1 waiting writer place of rwlock {name!r}" in output, output
    assert not r.exists(key_of(name, "rw:writers_waiting"))
    reader = redmutex.RWLock(client, name, ttl=10).read()
    assert reader.acquire(timeout=0)
    reader.release()
