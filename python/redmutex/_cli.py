"""`python -m redmutex status | list | release`: look at (and, when you must, break) the locks on a
Redis server from a shell.

These commands read the fixed key layout (API.md, "Key layout") with redis-py, an optional
dependency needed by these commands only: every key of the primitive named N starts with
`prefix{N}`, followed by

    :lock, :fence                                        Lock (the fence counter expires
                                                         fence_ttl after the last acquisition)
    :queue, :queue:deadlines, :queue:leases              its fair queue: list of tokens, zset of
                                                         places, hash of the lease each one asks
    :sem:holders, :sem:limit, :sem:queue,                Semaphore (the limit in use)
    :sem:queue:deadlines
    :rw:readers, :rw:writer, :rw:writers_waiting         RWLock
    :value, :fill                                        cache entry (get_or_fill, @cached)

Leases stored as zset scores (semaphore holders, readers, places in a queue) are in milliseconds
of the Redis server's clock, so "live" is decided against the server's `TIME`, never ours.

Exit codes: `status` 0 when anything under the name is held, 1 when it is free; `release` 0 when
it released a holder, 1 when there was nothing to release (or the confirmation was declined);
`list` 0. Any error: 2, with one line on stderr that never contains a password.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    import redis

EXIT_OK = 0
EXIT_HELD = 0
EXIT_FREE = 1  # status: nothing held; release: nothing released
EXIT_ERROR = 2

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "redmutex:"
TIMEOUT = 5.0  # seconds, to connect and for each command
TOKEN_SHOWN = 8  # hex characters of an owner token that we print (enough to tell holders apart)
HOLDERS_SHOWN = 10  # holders listed per line in the text output (--json lists all)
NAME_SHOWN = 60  # characters of a name in the text output at most (--json gives names whole)
SCAN_COUNT = 1000

# Suffix of each key -> (kind of primitive, role of the key).
SUFFIXES: dict[str, tuple[str, str]] = {
    ":lock": ("lock", "lock"),
    ":fence": ("lock", "fence"),
    ":queue": ("lock", "queue"),
    ":queue:deadlines": ("lock", "queue_deadlines"),
    ":queue:leases": ("lock", "queue_leases"),
    ":sem:holders": ("semaphore", "holders"),
    ":sem:limit": ("semaphore", "limit"),
    ":sem:queue": ("semaphore", "queue"),
    ":sem:queue:deadlines": ("semaphore", "queue_deadlines"),
    ":rw:readers": ("rwlock", "readers"),
    ":rw:writer": ("rwlock", "writer"),
    ":rw:writers_waiting": ("rwlock", "writers_waiting"),
    ":value": ("cache", "value"),
    ":fill": ("cache", "fill"),
}
KINDS = ("lock", "semaphore", "rwlock", "cache")

# Deletes the lock key if somebody holds it (and, when ARGV[2] is not empty, only if that is
# still the holder the user confirmed), then wakes every waiter: an empty message wakes all of
# them, and in a fair queue the head then takes the lock itself (a release by its holder would
# grant it to the head directly).
# KEYS[1] lock key   ARGV[1] wake-up channel   ARGV[2] expected holder token or ''
# Reply: the token that held the lock; false: nobody held it; {err} the holder changed.
FORCE_RELEASE = """
local token = redis.call('GET', KEYS[1])
if not token then
  return false
end
if ARGV[2] ~= '' and token ~= ARGV[2] then
  return redis.error_reply('the holder changed meanwhile; nothing released')
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '')
return token
"""


class CliError(Exception):
    """A failure the command reports as one line (exit code 2)."""


# -- connecting ---------------------------------------------------------------------------------


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise CliError(
            "this command needs redis-py: pip install 'redmutex[redis]' (or pip install redis)"
        ) from None
    return redis


# Where a URL's user-info ends and which parts are secret: the rule of the Rust core
# (src/protocol/url.rs), so that the raw form it accepts ("redis://u:se/cret@h") is read, and
# redacted, the same way here.
_SECRET_KEYS = ("pass", "password", "sentinel_password")
_QUERY_KEYS = (*_SECRET_KEYS, "db", "user", "username", "protocol", "sentinel_username")


def _userinfo_range(url: str) -> tuple[int, int] | None:
    """(start, at) of the user-info: after `://` up to the last `@` before a secret query key."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    rest = url[start:]
    if rest.startswith("/"):
        return None
    markers = [rest.find(f"{sep}{key}=") for key in _SECRET_KEYS for sep in "?&"]
    limit = min([m for m in markers if m >= 0], default=len(rest))
    at = rest.rfind("@", 0, limit)
    return None if at < 0 else (start, start + at)


def url_secrets(url: str) -> list[str]:
    """The secret parts of a URL (the user-info password, secret query values), raw and decoded."""
    found: list[str] = []
    span = _userinfo_range(url)
    if span is not None:
        _user, colon, password = url[span[0] : span[1]].partition(":")
        if colon:
            found += [password, unquote(password)]
    for key in _SECRET_KEYS:
        for sep in "?&":
            marker = f"{sep}{key}="
            at = url.find(marker)
            while at >= 0:
                value = url[at + len(marker) :]
                ends = [value.find(f"&{k}=") for k in _QUERY_KEYS]
                value = value[: min([e for e in ends if e >= 0], default=len(value))]
                value = value.removesuffix("#insecure")
                first = value.split("&", 1)[0]
                found += [value, unquote(value), first, unquote(first.replace("+", " "))]
                at = url.find(marker, at + 1)
    return [s for s in found if s]


def normalize_url(url: str) -> str:
    """The URL with `/ ? # @` in its user-info percent-encoded (the raw form the core accepts)."""
    span = _userinfo_range(url)
    if span is None:
        return url
    start, at = span
    info = "".join(
        {"/": "%2F", "?": "%3F", "#": "%23", "@": "%40"}.get(c, c) for c in url[start:at]
    )
    return url[:start] + info + url[at:]


def redis_kwargs(url: str) -> dict[str, Any]:
    """redis-py connection settings for a redmutex URL (the schemes and query keys the Rust
    core accepts: redis://, rediss:// with `#insecure`, redis+unix:// and unix:// with
    `?db=N&user=U&pass=P`)."""
    parts = urlsplit(normalize_url(url))
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
        "decode_responses": False,
    }
    if parts.scheme in ("unix", "redis+unix"):
        kwargs["unix_socket_path"] = unquote(parts.path)
        kwargs["db"] = int(query.get("db", "0"))
        username = query.get("user") or query.get("username")
        password = query.get("pass") or query.get("password")
    elif parts.scheme in ("redis", "rediss"):
        kwargs["host"] = parts.hostname or "127.0.0.1"
        kwargs["port"] = parts.port or 6379
        db = parts.path.strip("/")
        kwargs["db"] = int(db) if db else 0
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if parts.scheme == "rediss":
            kwargs["ssl"] = True
            if parts.fragment == "insecure":
                kwargs["ssl_cert_reqs"] = "none"
                kwargs["ssl_check_hostname"] = False
    else:
        raise CliError("url: the scheme must be redis://, rediss://, redis+unix:// or unix://")
    if username:
        kwargs["username"] = username
    if password:
        kwargs["password"] = password
    return kwargs


@dataclass
class Target:
    """Where a command looks: a redis-py connection, the URL as it may be shown, the prefix."""

    conn: redis.Redis
    shown_url: str
    prefix: str

    def base(self, name: str) -> bytes:
        if not name:
            raise CliError("name: must not be empty")
        try:
            return (self.prefix + "{" + name + "}").encode("utf-8")
        except UnicodeEncodeError:
            raise CliError("name: must be valid Unicode") from None


def connect(args: argparse.Namespace) -> Target:
    import redmutex

    url = args.redis or os.environ.get("REDIS_URL") or DEFAULT_URL
    # The core's parser validates the URL (ValueError with the URL redacted) and gives the
    # redacted form we may print.
    try:
        client = redmutex.Client(url, prefix=args.prefix)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    shown = client.url
    client.close()
    redis_py = _redis_module()
    try:
        kwargs = redis_kwargs(url)
    except ValueError:
        raise CliError(f"url: invalid Redis URL '{shown}'") from None
    # One try: a command line reports a refused connection at once rather than retrying.
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs["retry"] = Retry(NoBackoff(), 0)
    return Target(redis_py.Redis(**kwargs), shown, args.prefix)


def _redis_failure(exc: Exception, target: Target) -> CliError:
    """One line for a redis-py error (its messages carry host and port, never the password)."""
    from redis import exceptions

    if isinstance(exc, exceptions.AuthenticationError):
        return CliError(f"Redis at {target.shown_url} refused the credentials: {exc}")
    if isinstance(exc, (exceptions.ConnectionError, exceptions.TimeoutError)):
        return CliError(f"cannot reach Redis at {target.shown_url}: {exc}")
    if isinstance(exc, exceptions.ResponseError) and "holder changed" in str(exc):
        return CliError(str(exc))
    return CliError(f"Redis at {target.shown_url} answered with an error: {exc}")


def _run(target: Target, func: Any, *args: Any) -> Any:
    """`func(*args)` with redis-py's errors turned into one-line CliErrors."""
    from redis import exceptions

    try:
        return func(*args)
    except exceptions.RedisError as exc:
        raise _redis_failure(exc, target) from None


# -- reading the state of one name -------------------------------------------------------------


def shown_name(name: str, limit: int = NAME_SHOWN) -> str:
    """A name as the text output shows it: at most `limit` characters, control characters
    escaped (a name may hold newlines), and a long one cut with its length said. Names may be
    megabytes long; only the part shown is looked at."""
    cut = len(name) > limit
    head = name[: limit + 1]
    if head.isprintable() and not cut:
        return name
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    if not cut and len(text) <= limit:
        return text
    more = f"... ({len(name)} chars)"
    return text[: max(limit - len(more), 8)] + more


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _short(token: bytes | str) -> str:
    text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
    return text if len(text) <= TOKEN_SHOWN else text[:TOKEN_SHOWN]


def _seconds(ms: float) -> float:
    return round(ms / 1000.0, 3)


@dataclass
class Hold:
    """One holder: the first characters of its token and the seconds left on its lease."""

    holder: str
    remaining: float | None  # None: the key has no expiry (never written so by redmutex)


def _hold_of_string(token: bytes | None, pttl: int) -> Hold | None:
    if token is None:
        return None
    return Hold(_short(token), _seconds(pttl) if pttl >= 0 else None)


def _live(scored: Iterable[tuple[bytes, float]], now_ms: float) -> list[Hold]:
    """Members of a token -> lease-end zset whose lease is still running, soonest end first."""
    live = [(score, token) for token, score in scored if score > now_ms]
    live.sort()
    return [Hold(_short(token), _seconds(score - now_ms)) for score, token in live]


@dataclass
class Status:
    name: str
    prefix: str
    held: bool = False
    lock: Hold | None = None
    fence: int | None = None
    waiters: int = 0
    semaphore: dict[str, Any] | None = None
    rwlock: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def read_status(target: Target, name: str) -> Status:
    """One consistent snapshot (MULTI/EXEC: all keys of a name share one cluster slot)."""
    base = target.base(name)
    pipe = target.conn.pipeline(transaction=True)
    pipe.time()
    pipe.get(base + b":lock")
    pipe.pttl(base + b":lock")
    pipe.get(base + b":fence")
    pipe.zrange(base + b":queue:deadlines", 0, -1, withscores=True)
    pipe.zrange(base + b":sem:holders", 0, -1, withscores=True)
    pipe.zrange(base + b":sem:queue:deadlines", 0, -1, withscores=True)
    pipe.exists(base + b":sem:holders", base + b":sem:queue")
    pipe.get(base + b":rw:writer")
    pipe.pttl(base + b":rw:writer")
    pipe.zrange(base + b":rw:readers", 0, -1, withscores=True)
    pipe.zrange(base + b":rw:writers_waiting", 0, -1, withscores=True)
    pipe.pttl(base + b":value")
    pipe.get(base + b":fill")
    pipe.pttl(base + b":fill")
    (
        (seconds, micros),
        lock_token,
        lock_pttl,
        fence,
        queue_places,
        sem_holders,
        sem_places,
        sem_keys,
        writer_token,
        writer_pttl,
        readers,
        writers_waiting,
        value_pttl,
        fill_token,
        fill_pttl,
    ) = _run(target, pipe.execute)
    now_ms = seconds * 1000 + micros // 1000

    status = Status(name=name, prefix=target.prefix)
    status.lock = _hold_of_string(lock_token, lock_pttl)
    status.fence = int(fence) if fence is not None else None
    status.waiters = len(_live(queue_places, now_ms))
    if sem_keys:
        status.semaphore = {
            "holders": [asdict(h) for h in _live(sem_holders, now_ms)],
            "waiters": len(_live(sem_places, now_ms)),
        }
    writer = _hold_of_string(writer_token, writer_pttl)
    live_readers = _live(readers, now_ms)
    waiting_writers = len(_live(writers_waiting, now_ms))
    if writer is not None or readers or writers_waiting:
        status.rwlock = {
            "writer": asdict(writer) if writer is not None else None,
            "readers": [asdict(h) for h in live_readers],
            "writers_waiting": waiting_writers,
        }
    fill = _hold_of_string(fill_token, fill_pttl)
    if value_pttl != -2 or fill is not None:
        status.cache = {
            "stored": value_pttl != -2,
            "remaining": _seconds(value_pttl) if value_pttl >= 0 else None,
            "filling": asdict(fill) if fill is not None else None,
        }
    status.held = bool(
        status.lock is not None
        or (status.semaphore and status.semaphore["holders"])
        or (status.rwlock and (status.rwlock["writer"] or status.rwlock["readers"]))
        or fill is not None
    )
    return status


def _lease(hold: Hold | dict[str, Any]) -> str:
    data = asdict(hold) if isinstance(hold, Hold) else hold
    left = data["remaining"]
    lease = "no expiry" if left is None else f"{left:.3f} s left"
    return f"{data['holder']}... ({lease})"


def _holders_line(holds: Sequence[dict[str, Any]]) -> str:
    shown = ", ".join(_lease(h) for h in holds[:HOLDERS_SHOWN])
    more = f", and {len(holds) - HOLDERS_SHOWN} more" if len(holds) > HOLDERS_SHOWN else ""
    return f"{len(holds)}: {shown}{more}" if holds else "0"


def status_lines(status: Status) -> Iterator[str]:
    yield f"name:      {shown_name(status.name)}   (prefix {status.prefix!r})"
    yield f"state:     {'held' if status.held else 'free'}"
    if status.lock is not None:
        yield f"lock:      held by {_lease(status.lock)}"
    elif status.fence is not None or status.waiters:
        yield "lock:      free"
    if status.fence is not None:
        yield f"fence:     {status.fence}"
    if status.waiters:
        yield f"waiting:   {status.waiters} in the fair queue"
    if status.semaphore is not None:
        yield f"semaphore: holders {_holders_line(status.semaphore['holders'])}"
        if status.semaphore["waiters"]:
            yield f"           {status.semaphore['waiters']} waiting in the fair queue"
    if status.rwlock is not None:
        writer = status.rwlock["writer"]
        yield f"rwlock:    writer {_lease(writer) if writer else 'none'}"
        yield f"           readers {_holders_line(status.rwlock['readers'])}"
        if status.rwlock["writers_waiting"]:
            yield f"           {status.rwlock['writers_waiting']} writers waiting"
    if status.cache is not None:
        cache = status.cache
        if cache["stored"]:
            left = cache["remaining"]
            stored = "stored, no expiry" if left is None else f"stored ({left:.3f} s left)"
        else:
            stored = "no value"
        filling = f"; being filled by {_lease(cache['filling'])}" if cache["filling"] else ""
        yield f"cache:     {stored}{filling}"
    if status == Status(name=status.name, prefix=status.prefix):
        yield "           (nothing is stored under this name)"


# -- listing -----------------------------------------------------------------------------------


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def split_key(key: bytes, prefix: bytes) -> tuple[str, str, str] | None:
    """(name, kind, role) of a redmutex key, or None for a key of something else.

    A key is `prefix + "{" + name + "}" + suffix`; names may hold braces, suffixes never do, so
    the name ends at the last "}".
    """
    if not key.startswith(prefix + b"{"):
        return None
    close = key.rfind(b"}")
    if close < len(prefix) + 1:
        return None
    known = SUFFIXES.get(key[close + 1 :].decode("ascii", "replace"))
    name = key[len(prefix) + 1 : close]
    if known is None or not name:
        return None
    return name.decode("utf-8", "replace"), known[0], known[1]


@dataclass
class Entry:
    name: str
    kind: str
    base: bytes  # prefix{name}, as found: the name's own bytes, even when not valid UTF-8
    roles: set[str] = field(default_factory=set)
    state: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def scan_entries(target: Target) -> list[Entry]:
    """Every primitive under the prefix, found with SCAN (never KEYS), sorted by name and kind."""
    prefix = target.prefix.encode("utf-8")
    pattern = _glob_escape(target.prefix) + "{*"
    found: dict[tuple[str, str], Entry] = {}
    keys = _run(target, lambda: list(target.conn.scan_iter(match=pattern, count=SCAN_COUNT)))
    for key in keys:
        parsed = split_key(key, prefix)
        if parsed is None:
            continue
        name, kind, role = parsed
        base = key[: key.rfind(b"}") + 1]
        found.setdefault((name, kind), Entry(name, kind, base)).roles.add(role)
    entries = sorted(found.values(), key=lambda e: (e.name, KINDS.index(e.kind)))
    _describe(target, entries)
    return entries


def _describe(target: Target, entries: list[Entry]) -> None:
    """Fill in each entry's state with one pipeline per batch of entries."""
    batch = 200
    for start in range(0, len(entries), batch):
        chunk = entries[start : start + batch]
        pipe = target.conn.pipeline(transaction=False)
        pipe.time()
        for entry in chunk:
            base = entry.base
            if entry.kind == "lock":
                pipe.pttl(base + b":lock")
                pipe.get(base + b":fence")
                pipe.zrange(base + b":queue:deadlines", 0, -1, withscores=True)
            elif entry.kind == "semaphore":
                pipe.zrange(base + b":sem:holders", 0, -1, withscores=True)
                pipe.zrange(base + b":sem:queue:deadlines", 0, -1, withscores=True)
                pipe.exists(base + b":sem:holders")  # keeps three replies per entry
            elif entry.kind == "rwlock":
                pipe.pttl(base + b":rw:writer")
                pipe.zrange(base + b":rw:readers", 0, -1, withscores=True)
                pipe.zrange(base + b":rw:writers_waiting", 0, -1, withscores=True)
            else:
                pipe.pttl(base + b":value")
                pipe.pttl(base + b":fill")
                pipe.exists(base + b":value")
        replies = _run(target, pipe.execute)
        seconds, micros = replies[0]
        now_ms = seconds * 1000 + micros // 1000
        for i, entry in enumerate(chunk):
            a, b, c = replies[1 + 3 * i : 4 + 3 * i]
            _state(entry, a, b, c, now_ms)


def _state(entry: Entry, a: Any, b: Any, c: Any, now_ms: float) -> None:
    if entry.kind == "lock":
        held = a != -2
        waiting = len(_live(c, now_ms))
        entry.detail = {
            "held": held,
            "remaining": _seconds(a) if a >= 0 else None,
            "fence": int(b) if b is not None else None,
            "waiters": waiting,
        }
        parts = [f"held ({a / 1000:.3f} s left)" if held and a >= 0 else "held" if held else "free"]
        if b is not None:
            parts.append(f"fence {int(b)}")
        if waiting:
            parts.append(f"{waiting} waiting")
        entry.state = ", ".join(parts)
    elif entry.kind == "semaphore":
        holders, waiting = len(_live(a, now_ms)), len(_live(b, now_ms))
        entry.detail = {"held": holders > 0, "holders": holders, "waiters": waiting}
        entry.state = f"{holders} holder{'s' if holders != 1 else ''}" + (
            f", {waiting} waiting" if waiting else ""
        )
    elif entry.kind == "rwlock":
        writer, readers, waiting = a != -2, len(_live(b, now_ms)), len(_live(c, now_ms))
        entry.detail = {
            "held": writer or readers > 0,
            "writer": writer,
            "readers": readers,
            "writers_waiting": waiting,
        }
        parts = ["writer" if writer else f"{readers} reader{'s' if readers != 1 else ''}"]
        if waiting:
            parts.append(f"{waiting} writer{'s' if waiting != 1 else ''} waiting")
        entry.state = ", ".join(parts)
    else:
        stored, filling = a != -2, b != -2
        entry.detail = {
            "held": filling,
            "stored": stored,
            "remaining": _seconds(a) if a >= 0 else None,
            "filling": filling,
        }
        if stored:
            entry.state = f"stored ({a / 1000:.3f} s left)" if a >= 0 else "stored"
        else:
            entry.state = "no value"
        if filling:
            entry.state += ", being filled"


# -- commands ----------------------------------------------------------------------------------


def _write(text: str, out: TextIO | None = None) -> None:
    """Writes to stdout; a reader that went away (`| head`) is not an error of ours."""
    out = out or sys.stdout
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        # Python would fail again flushing stdout at exit: point it at /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)


def _print(*lines: str) -> None:
    _write("".join(line + "\n" for line in lines))


def _print_json(data: Any) -> None:
    _write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def cmd_status(args: argparse.Namespace) -> int:
    target = connect(args)
    try:
        status = read_status(target, args.name)
    finally:
        target.conn.close()
    if args.json:
        _print_json(status.as_json())
    else:
        _print(*status_lines(status))
    return EXIT_HELD if status.held else EXIT_FREE


def _active(entry: Entry) -> bool:
    """Held, queued for, or (a cache entry) storing a value: not just an idle fence counter."""
    d = entry.detail
    return any(d.get(k) for k in ("held", "waiters", "writers_waiting", "stored"))


def cmd_list(args: argparse.Namespace) -> int:
    target = connect(args)
    try:
        entries = scan_entries(target)
    finally:
        target.conn.close()
    if not args.all:
        entries = [e for e in entries if _active(e)]
    if args.json:
        _print_json([{"name": e.name, "kind": e.kind, **e.detail} for e in entries])
        return EXIT_OK
    if not entries:
        idle = "" if args.all else " held or queued (--all also shows idle fence counters)"
        _print(f"nothing under the prefix {target.prefix!r}{idle}")
        return EXIT_OK
    # Names are shortened to NAME_SHOWN characters, so a name of megabytes neither widens
    # every row nor floods the terminal.
    names = [shown_name(e.name) for e in entries]
    width = max(len("NAME"), *(len(n) for n in names))
    _print(
        f"{'KIND':<10} {'NAME':<{width}}  STATE",
        *(f"{e.kind:<10} {n:<{width}}  {e.state}" for e, n in zip(entries, names)),
    )
    return EXIT_OK


def _confirm(question: str) -> bool:
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        raise CliError(
            "release breaks somebody else's lock: pass --force (the holder will get"
            " LockLostError on its next extend or release)"
        )
    target = connect(args)
    try:
        base = target.base(args.name)
        expected = b""
        if not args.yes and sys.stdin.isatty():
            pipe = target.conn.pipeline(transaction=True)
            pipe.get(base + b":lock")
            pipe.pttl(base + b":lock")
            token, pttl = _run(target, pipe.execute)
            holder = _hold_of_string(token, pttl)
            if token is None or holder is None:
                return _not_released(args, "it is not held")
            if not _confirm(f"Release lock {args.name!r} held by {_lease(holder)}?"):
                return _not_released(args, "not confirmed")
            expected = token
        released = _run(
            target,
            target.conn.eval,
            FORCE_RELEASE,
            1,
            base + b":lock",
            base + b":wake",
            expected,
        )
    finally:
        target.conn.close()
    if released is None:
        return _not_released(args, "it is not held")
    was_held_by = _short(released)
    if args.json:
        _print_json({"name": args.name, "released": True, "holder": was_held_by})
    else:
        _print(f"released lock {args.name!r} (held by {was_held_by}...); waiters woken")
    return EXIT_OK


def _not_released(args: argparse.Namespace, why: str) -> int:
    if args.json:
        _print_json({"name": args.name, "released": False, "reason": why})
    else:
        _print(f"lock {args.name!r} not released: {why}")
    return EXIT_FREE


# -- wiring into `python -m redmutex` ----------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        metavar="URL",
        help=f"Redis URL (default: $REDIS_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"the key prefix of the Client (default: {DEFAULT_PREFIX!r})",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    status = commands.add_parser(
        "status",
        help="who holds a lock (and its semaphore, rwlock or cache keys), its fence and waiters",
        description="Shows the holder (first characters of its token) and the lease left, the"
        " fencing counter and the waiters in the fair queue of the lock NAME, plus semaphore"
        " holders, read-write lock readers/writer and the cache entry stored under NAME."
        " Exit code: 0 held, 1 free, 2 error.",
    )
    status.add_argument("name", metavar="NAME")
    _common(status)
    status.set_defaults(handler=cmd_status)

    listing = commands.add_parser(
        "list",
        help="what is held or queued under the prefix (SCAN); --all also idle fence counters",
        description="Lists every lock, semaphore, read-write lock and cache entry under the"
        " prefix that is held, has waiters or (cache) stores a value, found with SCAN (never"
        " KEYS), with its state; --all also lists the idle ones (a lock's fence counter lives"
        " fence_ttl after its last acquisition). Exit code: 0, 2 on error.",
    )
    listing.add_argument(
        "--all", action="store_true", help="also list idle names (only a fence counter left)"
    )
    _common(listing)
    listing.set_defaults(handler=cmd_list)

    release = commands.add_parser(
        "release",
        help="break a lock: delete its key and wake its waiters (needs --force)",
        description="Deletes the lock NAME whoever holds it and wakes its waiters, as a release"
        " would. The holder is not told: its next extend or release raises LockLostError. Asks"
        " for confirmation on a terminal unless --yes. Exit code: 0 released, 1 nothing"
        " released (not held, or not confirmed), 2 error.",
    )
    release.add_argument("name", metavar="NAME")
    release.add_argument("--force", action="store_true", help="required: yes, break the lock")
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    _common(release)
    release.set_defaults(handler=cmd_release)
