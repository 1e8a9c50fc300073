"""Issue 13 item 8: a password never shows, whatever characters it holds, and it still works.

Every URL form (redis://, rediss://, redis+unix://, unix://, redis+sentinel://, Redlock lists,
cluster seeds), with passwords holding `/ @ : ? # %` and non-ASCII, raw and percent-encoded:
no exception message, repr, `url` or log line may carry any part of the password. Accepted
(see README "Passwords in URLs"): the percent-encoded form everywhere; in the user-info the raw
form too (a `%` followed by two hex digits is an escape there); in a query `& # + %` encoded.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
import redis
import redmutex
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(120)

# Each password is two markers around special characters: neither marker may ever show.
MARKERS = ("Zq1", "Zq2")
SPECIALS = ["/", "@", ":", "?", "#", "%", "%41", "ä密", "/@:?#%", "&", "+", " "]
PASSWORDS = [f"Zq1{s}Zq2" for s in SPECIALS]
FAST = {"connect_timeout": 0.5, "command_timeout": 0.5}


def forms(pw: str) -> list[str]:
    """URLs of every form carrying `pw` (as given: raw or encoded), valid and malformed."""
    return [
        f"redis://user:{pw}@127.0.0.1:1/0",
        f"redis://:{pw}@127.0.0.1:1",
        f"redis://user:{pw}@127.0.0.1:1/notadb",
        f"redis://user:{pw}@127.0.0.1:99999/0",
        f"rediss://user:{pw}@127.0.0.1:1/0#insecure",
        f"rediss://user:{pw}@127.0.0.1:1/0#bogus",
        f"http://user:{pw}@127.0.0.1:1/0",
        f"redis+unix:///tmp/redmutex-none.sock?pass={pw}",
        f"unix:///tmp/redmutex-none.sock?db=2&user=u&pass={pw}",
        f"unix:///tmp/redmutex-none.sock?db=x&pass={pw}",
        f"redis+sentinel://user:{pw}@127.0.0.1:1/svc",
        f"redis+sentinel://127.0.0.1:1/svc/0?sentinel_password={pw}",
        f"redis+sentinel://user:{pw}@127.0.0.1:1/svc/x",
        f"rediss+sentinel://127.0.0.1:1/svc?sentinel_password={pw}#bogus",
        # A scheme written wrong or left out: refused, and echoed without the password.
        f"redis:/user:{pw}@127.0.0.1:1/0",
        f"user:{pw}@127.0.0.1:1",
        f"//user:{pw}@127.0.0.1:1",
        f"127.0.0.1:1/0?pass={pw}",
    ]


def assert_hidden(text: str, what: str) -> None:
    for marker in MARKERS:
        assert marker not in text, f"{what} shows the password: {text!r}"


def exercise(make: Callable[[], redmutex.Client], what: str) -> None:
    """Constructs, shows, and uses a client: every message and view must hide the password."""
    try:
        c = make()
    except (ValueError, TypeError, redmutex.LockError) as exc:
        assert_hidden(str(exc), f"{what}: construction error")
        assert_hidden(repr(exc), f"{what}: construction error repr")
        return
    assert_hidden(repr(c), f"{what}: repr")
    assert_hidden(c.url, f"{what}: url")
    for use in (c.ping, lambda: redmutex.Lock(c, "n", ttl=1).acquire(blocking=False)):
        try:
            use()
        except Exception as exc:  # noqa: BLE001 - every failure's text is inspected
            assert_hidden(str(exc), f"{what}: error")
            assert_hidden(repr(exc), f"{what}: error repr")
    c.close()


@pytest.mark.parametrize("encoded", [False, True], ids=["raw", "encoded"])
@pytest.mark.parametrize("password", PASSWORDS, ids=SPECIALS)
def test_a_password_never_shows(
    password: str, encoded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    pw = quote(password, safe="") if encoded else password
    caplog.set_level(logging.DEBUG)
    for url in forms(pw):
        exercise(lambda url=url: redmutex.Client(url, **FAST), url)  # type: ignore[misc]
        exercise(
            lambda url=url: redmutex.Client([url, "redis://127.0.0.1:2/0"], **FAST),  # type: ignore[misc]
            f"Redlock [{url}, ...]",
        )
        exercise(
            lambda url=url: redmutex.Client([url, url], **FAST),  # type: ignore[misc]
            f"Redlock [{url}, {url}]",
        )
        exercise(
            lambda url=url: redmutex.Client(cluster=[url], **FAST),  # type: ignore[misc]
            f"cluster [{url}]",
        )
    exercise(
        lambda: redmutex.Client(cluster=[f"redis://u:{pw}@127.0.0.1:1/3"], **FAST),
        "cluster with a db",
    )
    assert_hidden(caplog.text, "the log")


@pytest.fixture
def acl_server(make_server: Callable[..., RedisServer]) -> Iterator[tuple[RedisServer, str]]:
    """A server with users whose passwords hold every special character, on TCP and a socket."""
    sock_dir = tempfile.mkdtemp(prefix="redmutex-sock-")
    sock = os.path.join(sock_dir, "redis.sock")
    server = make_server(extra_args=["--unixsocket", sock, "--unixsocketperm", "700"])
    with redis.Redis(port=server.port) as r:
        for i, password in enumerate(PASSWORDS):
            r.execute_command("ACL", "SETUSER", f"u{i}", "on", f">{password}", "~*", "&*", "+@all")
    try:
        yield server, sock
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_such_passwords_still_work(acl_server: tuple[RedisServer, str]) -> None:
    server, sock = acl_server
    port = server.port
    for i, password in enumerate(PASSWORDS):
        enc = quote(password, safe="")
        urls = [
            f"redis://u{i}:{enc}@127.0.0.1:{port}/0",
            f"unix://{sock}?db=0&user=u{i}&pass={enc}",
            f"redis+unix://{sock}?user=u{i}&pass={enc}",
        ]
        # The raw form in the user-info, where it is unambiguous: a '%' followed by two hex
        # digits is an escape, so "%41" must be written %2541.
        if "%41" not in password:
            urls.append(f"redis://u{i}:{password}@127.0.0.1:{port}/0")
        # Raw in a query: everything but '& # + %' (and the space, which ends a URL).
        if not any(ch in password for ch in "&#+% "):
            urls.append(f"unix://{sock}?user=u{i}&pass={password}")
        # A query read as redis-py reads it: '+' is a space.
        form = quote(password, safe="").replace("%20", "+")
        urls.append(f"redis://127.0.0.1:{port}/0?username=u{i}&password={form}")
        for url in urls:
            c = redmutex.Client(url, prefix="s:", **FAST)
            assert_hidden(repr(c), url)
            try:
                assert c.ping(), url
                lock = redmutex.Lock(c, f"works-{i}", ttl=5)
                assert lock.acquire(blocking=False), url
                lock.release()
            finally:
                c.close()
        # A redis-py client with such a password is bridged (its URL is built encoded).
        with redis.Redis(port=port, username=f"u{i}", password=password) as r:
            lock = redmutex.Lock(r, f"bridged-{i}", ttl=5)
            assert lock.acquire(blocking=False)
            lock.release()


def test_the_command_line_hides_and_uses_such_passwords(
    acl_server: tuple[RedisServer, str],
) -> None:
    port = acl_server[0].port
    for i, password in enumerate(PASSWORDS):
        if password not in ("Zq1/Zq2", "Zq1/@:?#%Zq2", "Zq1ä密Zq2"):
            continue  # a subprocess each: the characters that break parsers are enough here
        for pw in (quote(password, safe=""), password):
            if pw == password and "%41" in password:
                continue
            for url, code in (
                (f"redis://u{i}:{pw}@127.0.0.1:{port}/0", 1),  # free: exit 1
                (f"redis://u{i}:{pw}@127.0.0.1:{port}/x", 2),  # malformed
                (f"redis://u{i}:{pw}x@127.0.0.1:{port}/0", 2),  # wrong password
            ):
                done = subprocess.run(
                    [sys.executable, "-m", "redmutex", "status", "nothing", "--redis", url],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert_hidden(done.stdout + done.stderr, f"CLI with {url}")
                assert done.returncode == code, (url, done.returncode, done.stderr)
