"""Issue 13, Redlock under faults: item 5 (a late vote must not land after the release) and
item 7 (one server listed twice under two names is refused)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redmutex
from _proxy import FaultProxy
from _scale_servers import Masters
from redmutex._core import CacheStore, FillClaim

pytestmark = pytest.mark.timeout(120)

FAST = {"connect_timeout": 1.0, "command_timeout": 1.0}


@pytest.fixture
def masters() -> Iterator[Masters]:
    with Masters(5) as m:
        yield m


def name() -> str:
    return "rlf-" + uuid.uuid4().hex[:12]


def refused_port() -> int:
    """A loopback port nobody listens on: bound to learn a free one, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# How long after a Redlock release returns a slow master's late vote has surely landed (its
# background delete then follows it).
LATE_DELETE_BOUND = 0.3


def released_everywhere(masters: Masters, key: str, token: str, limit: float) -> list[int]:
    """The masters on which `key` still holds `token` `limit` s on: [] once every background
    delete has landed (on a starved machine, later than a release returns)."""
    deadline = time.monotonic() + limit
    while (held := held_by(masters, key, token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


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
        # The release returns once a majority answered; its delete on a slow master goes on in
        # the background, after that master's late vote (measured up to 80 ms late on a loaded
        # machine). A vote that landed after the delete would keep the token for the lease.
        time.sleep(LATE_DELETE_BOUND)
        held = released_everywhere(masters, key, token, 5.0)  # a late vote keeps it 30 s
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
        time.sleep(LATE_DELETE_BOUND)  # see above
        held = released_everywhere(masters, key, token, 1.0)  # a late vote keeps it 2 s
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


def test_a_quorum_error_says_how_many_masters_failed(masters: Masters) -> None:
    """One master up, two refusing: the round is decided by the two failures, maybe before
    the live master's grant came (which is then given back). The message said "only 0 of 3
    masters answered", as if the live one had not."""
    urls = [
        masters.urls[0],
        f"redis://127.0.0.1:{refused_port()}",
        f"redis://127.0.0.1:{refused_port()}",
    ]
    c = redmutex.Client(urls, prefix="t:", **FAST)
    n = name()
    with pytest.raises(redmutex.QuorumError, match=r"2 of 3 masters failed, so no majority \(2\)"):
        redmutex.Lock(c, n, ttl=30).acquire(blocking=False)
    with masters.conn(0) as r:
        until = time.monotonic() + 5
        while r.exists(f"t:{{{n}}}:lock") and time.monotonic() < until:
            time.sleep(0.02)
        assert not r.exists(f"t:{{{n}}}:lock"), "the live master's grant was not given back"


def _held_in_dbs(key: str, dbs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (port, db) pairs of `dbs` on which `key` exists."""
    held = []
    for port, db in dbs:
        with redis.Redis(port=port, db=db) as r:
            if r.exists(key):
                held.append((port, db))
    return held


def test_a_hold_won_before_the_twin_answered_is_released_everywhere(masters: Masters) -> None:
    """Masters [X db 0, X db 3, Y]: a round won by X and Y returns before X's twin answers;
    its late vote then sets the key on X's db 3 and refuses the set. The release must still
    delete the token everywhere: before it raises when it finds the set refused (it raised at
    once before, and the hold stayed on all three until its lease ended), or in the background
    when a majority decided it before the twin answered."""
    x, y = masters.servers[0].port, masters.servers[1].port
    urls = [f"redis://127.0.0.1:{x}/0", f"redis://localhost:{x}/3", f"redis://127.0.0.1:{y}/0"]
    won, left = 0, []
    clients: list[redmutex.Client] = []
    deadline = time.monotonic() + 30
    for attempt in range(60):
        if won >= 5 or time.monotonic() > deadline:
            break
        n = name()
        client = redmutex.Client(urls, prefix="t:", **FAST)
        clients.append(client)
        lock = redmutex.Lock(client, n, ttl=30)
        try:
            if not lock.acquire(blocking=False):
                continue
        except ValueError:
            continue  # refused before the round was won: the case of the test above
        won += 1
        try:
            lock.release()
            settle = 2.0  # decided before the twin answered: its delete there lands later
        except ValueError as refused:
            assert "same server" in str(refused)
            settle = 0.0  # refused first: every delete has landed before the raise
        key = f"t:{{{n}}}:lock"
        held = _held_in_dbs(key, [(x, 0), (x, 3), (y, 0)])
        until = time.monotonic() + settle
        while held and time.monotonic() < until:
            time.sleep(0.02)
            held = _held_in_dbs(key, [(x, 0), (x, 3), (y, 0)])
        if held:
            left.append((attempt, held))
    for client in clients:
        client.close()
    if won == 0:
        pytest.skip("every round waited for the twin's answer (no late vote to test)")
    assert not left, f"left held after the release in {len(left)} of {won}: {left}"


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


# ------------------------------------------------- a call that timed out must not run out of turn


def _occupy(masters: Masters, key: str, indices: tuple[int, ...]) -> None:
    for i in indices:
        with masters.conn(i) as r:
            r.set(key, "someone-else", px=60_000)


def _free(masters: Masters, key: str, indices: tuple[int, ...]) -> None:
    for i in indices:
        with masters.conn(i) as r:
            r.delete(key)


@pytest.mark.parametrize("primitive", ["lock", "cache"])
def test_a_give_back_that_timed_out_never_lands_after_the_next_vote(
    masters: Masters, primitive: str
) -> None:
    """Master 3's requests reach it 0.6 s late while the command timeout is 0.3 s. X's first round
    is refused by masters 0, 1, 2 and 4 (held by someone else), so its vote on master 3 is given
    back; that give-back times out and waits in the network. Then master 3 is fast again and 2
    and 4 are freed: X's next round wins {2, 3, 4}, its vote on master 3 going on a new connection.
    The old give-back must not land after that vote and delete X's grant (it did: then a second
    caller took 0, 1 and 3, a majority, while X held)."""
    proxies = [FaultProxy(s.port).start() for s in masters.servers]
    try:
        c = redmutex.Client(
            [p.url for p in proxies], prefix="t:", connect_timeout=1.0, command_timeout=0.3
        )
        n = name()
        if primitive == "lock":
            key = f"t:{{{n}}}:lock"
            x = redmutex.Lock(c, n, ttl=30)
            assert x.acquire(blocking=False)  # the scripts are loaded everywhere
            x.release()
        else:
            key = f"t:{{{n}}}:fill"
            store = CacheStore(c, ttl=30, lock_ttl=30)
            warm = store.fetch(n + "-warm", timeout=0)
            assert isinstance(warm, FillClaim)
            warm.abandon()
        _occupy(masters, key, (0, 1, 2, 4))
        proxies[3].set_latency(0.6, "c2s")
        outcome: dict[str, object] = {}

        def take() -> None:
            if primitive == "lock":
                outcome["x"] = x.acquire(timeout=5)
            else:
                outcome["x"] = store.fetch(n, timeout=5)

        taker = threading.Thread(target=take)
        taker.start()
        time.sleep(0.35)  # X's first round is over; its give-back on master 3 timed out
        proxies[3].set_latency(0.0, "c2s")
        _free(masters, key, (4, 2))
        with masters.conn(2) as r:
            r.publish(f"t:{{{n}}}:wake", "")
        taker.join(10)
        assert not taker.is_alive()
        # X holds the lock (or the fill claim) on a majority.
        assert outcome["x"] is True or isinstance(outcome["x"], FillClaim), outcome
        time.sleep(0.6)  # the old give-back, if still under way, has landed by now
        if primitive == "lock":
            assert x.owned(), "X's grant on master 3 was deleted under it"
        _free(masters, key, (0, 1))
        other = redmutex.Client(masters.urls, prefix="t:", **FAST)
        if primitive == "lock":
            second = redmutex.Lock(other, n, ttl=30).acquire(blocking=False)
        else:
            second = CacheStore(other, ttl=30, lock_ttl=30).fetch(n, timeout=0)
        took = second is True or isinstance(second, FillClaim)
        assert not took, "a second caller took a majority while X held"
    finally:
        for p in proxies:
            p.stop()


@pytest.mark.parametrize("primitive", ["lock", "semaphore"])
def test_votes_held_up_past_the_timeout_are_given_back_once_they_ran(
    masters: Masters, primitive: str
) -> None:
    """Every master's requests reach it 1 s late while the command timeout is 0.3 s: the
    acquire raises QuorumError, and its round's give-backs wait at most one command timeout for
    the votes that timed out, so they are not sent. The votes then run and take the name on
    every master. The acquire is over, so it gives back once more after they ran; else nobody
    owns the name for its whole ttl (10 s) and another caller waits that long (the cache's
    lookup is tested in test_cache_late_lookup.py)."""
    proxies = [FaultProxy(s.port).start() for s in masters.servers]
    try:
        c = redmutex.Client(
            [p.url for p in proxies], prefix="t:", connect_timeout=1.0, command_timeout=0.3
        )
        other = redmutex.Client(masters.urls, prefix="t:", **FAST)
        n = name()

        def hold(client: redmutex.Client, ttl: float) -> redmutex.Lock | redmutex.Semaphore:
            if primitive == "lock":
                return redmutex.Lock(client, n, ttl=ttl)
            return redmutex.Semaphore(client, n, 1, ttl=ttl)

        warm = hold(c, 10)
        assert warm.acquire(blocking=False)  # the scripts are loaded everywhere
        warm.release()
        for p in proxies:
            p.set_latency(1.0, "c2s")

        def fast_again() -> None:
            for p in proxies:
                p.set_latency(0.0, "c2s")

        reset = threading.Timer(0.15, fast_again)
        reset.start()
        started = time.monotonic()
        with pytest.raises(redmutex.QuorumError):
            hold(c, 10).acquire(blocking=False)
        reset.join()
        time.sleep(max(0.0, started + 1.5 - time.monotonic()))  # the votes have run
        looked_at = time.monotonic()
        second = hold(other, 5)
        got = second.acquire(timeout=6)
        waited = time.monotonic() - looked_at
        assert got, f"another caller waited {waited:.1f} s in vain: the late votes held the name"
        assert waited < 3.0, f"another caller waited {waited:.1f} s for the late votes"
        second.release()
        c.close()
        other.close()
    finally:
        for p in proxies:
            p.stop()


def test_a_release_that_could_not_reach_a_master_deletes_there_once_it_answers(
    masters: Masters,
) -> None:
    """The release's delete on one master is lost (its requests black-holed past the command
    timeout); the majority released, so `release()` returns. The token there is the lock's own
    (drawn, never asked for again), so the delete is sent again until it lands; else the token
    stays there for the whole ttl (30 s), a vote short for everyone else."""
    proxies = [FaultProxy(s.port).start() for s in masters.servers]
    try:
        c = redmutex.Client(
            [p.url for p in proxies], prefix="t:", connect_timeout=0.5, command_timeout=0.3
        )
        n = name()
        key = f"t:{{{n}}}:lock"
        lock = redmutex.Lock(c, n, ttl=30)
        assert lock.acquire(blocking=False)
        token = lock.token
        proxies[0].blackhole("c2s")
        lock.release()
        time.sleep(0.5)
        proxies[0].heal()
        with masters.conn(0) as r:
            deadline = time.monotonic() + 5.0
            while r.get(key) == (token or "").encode() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert r.get(key) != (token or "").encode(), "the released token stayed on master 0"
        c.close()
    finally:
        for p in proxies:
            p.stop()


def test_a_value_on_too_few_masters_waits_for_the_silent_ones_before_a_refill(
    masters: Masters,
) -> None:
    """A holds the fill claim on masters 0, 1, 2; its store reaches 0 and 1 at once but master
    2 only 0.7 s later (the command timeout is 0.5 s, so a young value's grace is 1 s). B, woken
    by the store, sees the value on two masters, its own claims on 3 and 4, and no answer from 2.
    The value may still be confirmed there, so B must wait for it instead of counting it as
    absent and filling again (it did: the fill ran twice, one after the other)."""
    proxies = [FaultProxy(s.port).start() for s in masters.servers]
    try:
        urls = [p.url for p in proxies]
        timeouts = {"connect_timeout": 1.0, "command_timeout": 0.5}
        a = CacheStore(redmutex.Client(urls, prefix="t:", **timeouts), ttl=30, lock_ttl=30)
        b = CacheStore(redmutex.Client(urls, prefix="t:", **timeouts), ttl=30, lock_ttl=30)
        n = name()
        for store in (a, b):  # every script is loaded (a store sent once stays NOSCRIPT)
            warm = store.fetch(n + "-warm", timeout=0)
            assert isinstance(warm, FillClaim)
            warm.abandon()
            warm = store.fetch(n + "-warm", timeout=0)
            assert isinstance(warm, FillClaim)
            warm.store(b"warm")
            store.invalidate(n + "-warm")
        key = f"t:{{{n}}}:fill"
        _occupy(masters, key, (3, 4))
        claim = a.fetch(n, timeout=0)
        assert isinstance(claim, FillClaim)  # on 0, 1 and 2
        _free(masters, key, (3, 4))
        found: dict[str, object] = {}
        waiter = threading.Thread(target=lambda: found.update(b=b.fetch(n, timeout=8)))
        waiter.start()
        time.sleep(0.2)  # B waits for A's fill
        proxies[2].set_latency(0.7, "c2s")
        with contextlib.suppress(redmutex.QuorumError):
            claim.store(b"filled once")  # its answer from master 2 times out: no majority says
        proxies[2].set_latency(0.0, "c2s")
        waiter.join(10)
        assert not waiter.is_alive()
        got = found["b"]
        if isinstance(got, FillClaim):
            got.abandon()
        assert not isinstance(got, FillClaim), "B filled again while A's value was on its way"
        assert got is not None and got.payload == b"filled once"
    finally:
        for p in proxies:
            p.stop()


@pytest.mark.parametrize("age", ["old", "young"])
def test_a_value_on_too_few_masters_with_one_master_down(masters: Masters, age: str) -> None:
    """Master 0 is down; the value is on masters 1 and 2 only (a store that missed 3 and 4). It
    could still be a majority with master 0, which does not answer, so it is waited for while
    it is young (stored less than two command timeouts ago: its filler's store may still be on
    its way), and refilled at once when it is older."""
    proxy = FaultProxy(masters.servers[0].port).start()
    try:
        urls = [proxy.url, *masters.urls[1:]]
        store = CacheStore(
            redmutex.Client(urls, prefix="t:", connect_timeout=1.0, command_timeout=0.3),
            ttl=30,
            lock_ttl=30,
        )
        n = name()
        proxy.stop()  # connections to master 0 are refused from now on
        left_ms = 30_000 - (2_000 if age == "old" else 0)
        for i in (1, 2):
            with masters.conn(i) as r:
                r.set(f"t:{{{n}}}:value", b"on two masters", px=left_ms)
        started = time.monotonic()
        found = store.fetch(n, timeout=0)
        if age == "old":
            assert isinstance(found, FillClaim), found
        else:
            assert found is None  # not yet: a store may be on its way to master 0
            found = store.fetch(n, timeout=5)
            assert isinstance(found, FillClaim), found
            assert time.monotonic() - started >= 0.5  # the grace: 2 command timeouts
        found.abandon()
    finally:
        proxy.stop()


def test_a_stopped_minority_master_does_not_hold_up_renewal(masters: Masters) -> None:
    # Renewal (and owned()) is decided once a majority answers: a master that stopped answering
    # (SIGSTOP: connected, silent) must not hold each extend up to the command timeout, which
    # here outlasts the lease (ttl 2.5 s, renewal every ttl/3, command timeout 2 s).
    client = redmutex.Client(masters.urls, connect_timeout=1, command_timeout=2)
    lock = redmutex.Lock(client, name(), ttl=2.5, auto_renew=True)
    sem = redmutex.Semaphore(client, name(), 2, ttl=2.5, auto_renew=True)
    assert lock.acquire(timeout=5) and sem.acquire(timeout=5)
    stopped = masters.servers[4].process
    assert stopped is not None
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        time.sleep(6)  # more than two leases
        assert not lock.lost and not sem.lost
        started = time.monotonic()
        assert lock.owned()
        assert time.monotonic() - started < 1.5  # not the stopped master's 2 s
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    lock.release()
    sem.release()


def test_a_stopped_minority_master_does_not_hold_up_a_release(masters: Masters) -> None:
    # A release (and locked()) is decided once a majority answers; the stopped master's delete
    # goes on in the background and lands when it answers again (here before its lease ends).
    client = redmutex.Client(masters.urls, prefix="t:", connect_timeout=1, command_timeout=3)
    n = name()
    key = f"t:{{{n}}}:lock"
    lock = redmutex.Lock(client, n, ttl=60)
    sem = redmutex.Semaphore(client, name(), 2, ttl=60)
    assert lock.acquire(timeout=5) and sem.acquire(timeout=5)
    token = lock.token
    assert token is not None
    stopped = masters.servers[4].process
    assert stopped is not None
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert lock.locked()
        lock.release()
        sem.release()
        assert not lock.locked()
        took = time.monotonic() - started
        assert took < 2.5, f"release and locked() took {took:.2f} s (command timeout 3 s)"
        # The four answering masters let go (the stopped one cannot be asked); their deletes
        # may land after the release returned, decided by the first three.
        answering = [masters.conn(i) for i in range(4)]
        deadline = time.monotonic() + 5
        while (held := [i for i, r in enumerate(answering) if r.get(key) is not None]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        for r in answering:
            r.close()
        assert held == []
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while held_by(masters, key, token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held_by(masters, key, token) == []  # the background release landed


@pytest.mark.parametrize("blocking", [False, True])
def test_a_held_lock_with_a_majority_stopped_is_a_quorum_error_not_false(
    masters: Masters, blocking: bool
) -> None:
    # One live master says "held", two are silent: no majority answered, so the contract's
    # QuorumError, not False ("somebody holds it"), which a caller would take as an answer.
    client = redmutex.Client(masters.urls[:3], connect_timeout=1, command_timeout=1)
    n = name()
    holder = redmutex.Lock(client, n, ttl=60)
    assert holder.acquire(timeout=5)
    stopped = [s.process for s in masters.servers[1:3]]
    for p in stopped:
        assert p is not None
        os.kill(p.pid, signal.SIGSTOP)
    try:
        other = redmutex.Lock(client, n, ttl=60)
        started = time.monotonic()
        with pytest.raises(redmutex.QuorumError):
            if blocking:
                other.acquire(timeout=2)
            else:
                other.acquire(blocking=False)
        assert time.monotonic() - started < 3.5
    finally:
        for p in stopped:
            if p is not None:
                os.kill(p.pid, signal.SIGCONT)
    holder.release()
