"""Issue 13, Redlock under faults: item 5 (a late vote must not land after the release) and
item 7 (one server listed twice under two names is refused)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redmutex
from _scale_servers import Masters

pytestmark = pytest.mark.timeout(120)

FAST = {"connect_timeout": 1.0, "command_timeout": 1.0}


@pytest.fixture
def masters() -> Iterator[Masters]:
    with Masters(5) as m:
        yield m


def name() -> str:
    return "rlf-" + uuid.uuid4().hex[:12]


def held_by(masters: Masters, key: str, token: str) -> list[int]:
    """The masters on which `key` holds `token`."""
    found = []
    for i in range(len(masters.servers)):
        with masters.conn(i) as r:
            if r.get(key) == token.encode():
                found.append(i)
    return found


@pytest.mark.parametrize("release_script_loaded", [False, True])
def test_late_vote_after_script_flush_never_outlives_the_release(
    masters: Masters, release_script_loaded: bool
) -> None:
    """SCRIPT FLUSH on two masters makes their votes the slow ones (EVALSHA, NOSCRIPT, SCRIPT
    LOAD, EVALSHA): the majority wins without them, and the release must not overtake their
    resends. With the release script loaded again (by any release, as after a restart), the
    release takes one round trip there and always would."""
    c = redmutex.Client(masters.urls, prefix="t:", **FAST)
    assert c.ping()
    n = name()
    key = f"t:{{{n}}}:lock"
    lock = redmutex.Lock(c, n, ttl=30)
    left: list[tuple[int, list[int]]] = []
    iterations = 0
    deadline = time.monotonic() + 45
    while iterations < 30 and time.monotonic() < deadline:
        iterations += 1
        for i in (iterations % 5, (iterations + 1) % 5):  # two slow voters of five
            with masters.conn(i) as r:
                r.script_flush()
        if release_script_loaded:
            assert redmutex.release_lock(c, "warm-" + n, "0" * 32) is False
        assert lock.acquire(blocking=False)
        token = lock.token
        assert token is not None
        lock.release()
        time.sleep(0.05)  # a late vote has landed by now (loopback)
        held = held_by(masters, key, token)
        if held:
            left.append((iterations, held))
            for i in held:
                with masters.conn(i) as r:
                    r.delete(key)
    assert not left, (
        f"after the release, the released token still held a master in {len(left)} of "
        f"{iterations} iterations (iteration, masters): {left}"
    )


def test_late_vote_after_a_master_restart_never_outlives_the_release(masters: Masters) -> None:
    """A restarted master: a new connection, INFO, and NOSCRIPT on the first vote."""
    c = redmutex.Client(masters.urls, prefix="t:", **FAST)
    assert c.ping()
    n = name()
    key = f"t:{{{n}}}:lock"
    left: list[tuple[int, list[int]]] = []
    iterations = 0
    deadline = time.monotonic() + 40
    while iterations < 8 and time.monotonic() < deadline:
        iterations += 1
        masters.start_one(0)  # discounted for the longest lease (2 s): four masters count
        lock = redmutex.Lock(c, n, ttl=2)
        assert lock.acquire(timeout=5)
        token = lock.token
        assert token is not None
        lock.release()
        time.sleep(0.05)
        held = held_by(masters, key, token)
        if held:
            left.append((iterations, held))
            for i in held:
                with masters.conn(i) as r:
                    r.delete(key)
    assert not left, f"released token left held in {len(left)} of {iterations}: {left}"


def test_one_server_under_two_names_is_refused_at_first_contact(masters: Masters) -> None:
    port = masters.servers[0].port
    urls = [f"redis://127.0.0.1:{port}", f"redis://localhost:{port}", "redis://127.0.0.1:1"]
    n = name()
    for use in ("acquire", "ping"):
        c = redmutex.Client(urls, prefix="t:", **FAST)
        with pytest.raises(ValueError, match="same server") as caught:
            if use == "acquire":
                redmutex.Lock(c, n, ttl=30).acquire(blocking=False)
            else:
                c.ping()
        message = str(caught.value)
        assert f"redis://127.0.0.1:{port}" in message, message
        assert f"redis://localhost:{port}" in message, message
        # It stays refused, and nothing is left held on the one real server.
        with pytest.raises(ValueError, match="same server"):
            redmutex.Lock(c, n, ttl=30).acquire(blocking=False)
        with masters.conn(0) as r:
            assert r.get(f"t:{{{n}}}:lock") is None


def test_refused_acquire_gives_back_before_it_raises(masters: Masters) -> None:
    """The refusal ends the acquire for good: what its round set on the one real server is
    given back before the error reaches the caller, not just after (a connection open already
    reads the key at once)."""
    port = masters.servers[0].port
    urls = [f"redis://127.0.0.1:{port}", f"redis://localhost:{port}", "redis://127.0.0.1:1"]
    left = []
    iterations = 0
    deadline = time.monotonic() + 15
    with masters.conn(0) as r:
        r.ping()
        while iterations < 20 and time.monotonic() < deadline:
            iterations += 1
            n = name()
            key = f"t:{{{n}}}:lock"
            c = redmutex.Client(urls, prefix="t:", **FAST)
            with pytest.raises(ValueError, match="same server"):
                redmutex.Lock(c, n, ttl=30).acquire(blocking=False)
            if r.get(key) is not None:
                left.append(iterations)
                r.delete(key)
    assert not left, f"held right after the refusal in {len(left)} of {iterations}: {left}"


def test_one_server_twice_with_a_password_names_it_redacted(masters: Masters) -> None:
    server = masters.servers[0]
    with masters.conn(0) as r:
        r.execute_command("ACL", "SETUSER", "u", "on", ">Zq/se@c:r?e#t%", "~*", "&*", "+@all")
    secret = "Zq%2Fse%40c%3Ar%3Fe%23t%25"
    urls = [
        f"redis://u:{secret}@127.0.0.1:{server.port}/0",
        f"redis://u:{secret}@localhost:{server.port}/0",
        masters.urls[1],
    ]
    c = redmutex.Client(urls, prefix="t:", **FAST)
    with pytest.raises(ValueError, match="same server") as caught:
        c.ping()
    for shown in (str(caught.value), repr(c), c.url):
        assert "Zq" not in shown and "%2F" not in shown, shown
    assert f":{server.port}/0" in str(caught.value)


def test_one_address_twice_is_refused_at_construction(masters: Masters) -> None:
    port = masters.servers[0].port
    for urls in (
        [masters.urls[0], masters.urls[0], masters.urls[1]],
        [f"redis://127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/1", masters.urls[1]],
    ):
        with pytest.raises(ValueError, match="url"):
            redmutex.Client(urls)
