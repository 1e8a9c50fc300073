"""`python -m redmutex status | list | release`: look at (and, when you must, break) the locks on a
Redis server from a shell.

These commands read the fixed key layout (API.md, "Key layout") with redis-py, an optional
dependency needed by these commands only. What the Rust core owns comes from `_core`, never from
a copy here: the keys of a name (`_keys`, `_split_key`, `_scan_pattern`; src/protocol/keys.rs),
URL parsing and redaction (`_parse_url`, `_redact_url`; src/protocol/url.rs) and the forced
release (`_force_release`: lua/force_release.lua, run by the engine). Every key of the primitive
named N starts with `prefix{N}`, followed by

    :lock, :fence                                        Lock (the fence counter expires
                                                         fence_ttl after the last acquisition)
    :lock:holds                                          a re-entered Lock's hold count
    :lock:queue                                          its waiters: hash of each one's place
                                                         (turn, deadline, lease, inbox)
    :sem:holders, :sem:limit, :sem:queue,                Semaphore (the limit in use)
    :sem:queue:deadlines
    :rw:readers, :rw:writer, :rw:writers_waiting         RWLock
    :value, :fill                                        cache entry (get_or_fill, @cached)

Every URL form of `Client` works: one server (`--redis URL`, or $REDIS_URL), a Sentinel-managed
master (`--redis redis+sentinel://...`), a Redlock's masters (`--redis` given several times, or
URLs separated by commas: each comma that starts another `scheme://` starts another master, so a
Sentinel URL's own host list stays whole) and a Redis Cluster (`--cluster URL[,URL...]`, seeds).
On a Redlock `status` reads every master (held when a quorum is), `list` lists each master, and
`release` frees on every master; a master that cannot be reached is reported, not fatal, while
another one answers.

A MultiLock holds each of its names as a Lock, all with one token: `list` marks the lock names
that one token holds together ("multi-hold of N names"), and `status` of a held name lists the
other names its holder holds with the same token (found with SCAN).

Leases stored as zset scores (semaphore holders, readers, places in a queue) are in milliseconds
of the Redis server's clock, so "live" is decided against the server's `TIME`, never ours.

Exit codes: `status` 0 when anything under the name is held (on a Redlock: on a quorum of
masters), 1 when it is free (a waiting RWLock writer's place holds nothing, though it holds new
readers back: its state line says so); `release` 0 when
it freed a holder of anything, 1 when there was nothing to free (or the confirmation was declined);
`list` 0. Any error: 2, with one line on stderr that never contains a password.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import select
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from . import _core, errors

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


def _tls_kwargs(parts: dict[str, Any]) -> dict[str, Any]:
    """redis-py's TLS settings for what the core read of a URL (`rediss://`, `#insecure`, the
    `?ssl_*` query)."""
    if not parts["tls"]:
        return {}
    kwargs: dict[str, Any] = {"ssl": True}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if parts[key]:
            kwargs[key] = parts[key]
    if parts["insecure"] or not parts["ssl_verify_peer"]:
        kwargs["ssl_cert_reqs"] = "none"
        kwargs["ssl_check_hostname"] = False
    elif not parts["ssl_check_hostname"]:
        kwargs["ssl_check_hostname"] = False
    return kwargs


def _credentials(username: str | None, password: str | None) -> dict[str, Any]:
    return {
        **({"username": username} if username else {}),
        **({"password": password} if password else {}),
    }


def redis_kwargs(parts: dict[str, Any]) -> dict[str, Any]:
    """redis-py connection settings for one server, from what the core read of its URL
    (`_core._parse_url`: every scheme and query key a `Client` accepts)."""
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
        "decode_responses": False,
        "db": parts["db"],
        **_credentials(parts["username"], parts["password"]),
        **_tls_kwargs(parts),
    }
    if parts["socket"] is not None:
        kwargs["unix_socket_path"] = parts["socket"]
    else:
        kwargs["host"], kwargs["port"] = parts["hosts"][0]
    return kwargs


def sentinel_kwargs(
    parts: dict[str, Any],
) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """(sentinels, service, master settings, sentinel settings) of a `redis+sentinel://` URL,
    from what the core read of it."""
    base: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
        **_tls_kwargs(parts),
    }
    master = {
        **base,
        "decode_responses": False,
        "db": parts["db"],
        **_credentials(parts["username"], parts["password"]),
    }
    side = {**base, **_credentials(parts["sentinel_username"], parts["sentinel_password"])}
    return list(parts["hosts"]), parts["service"], master, side


# A list of URLs (Redlock) is split at each comma that starts another URL, so a Sentinel URL's
# own comma-separated sentinel hosts (`redis+sentinel://h1:26379,h2:26379/svc`) stay together.
_NEXT_URL = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def split_urls(values: Sequence[str]) -> list[str]:
    """The URLs of `--redis` given once or several times, each maybe a comma-separated list."""
    urls: list[str] = []
    for value in values:
        urls += [u.strip() for u in _NEXT_URL.split(value) if u.strip()]
    return urls


@dataclass
class Node:
    """One place the keys live: a server, a Sentinel-managed master, or a whole Redis Cluster
    (redis-py's cluster client routes each name to its slot's node)."""

    conn: Any  # redis.Redis or redis.cluster.RedisCluster
    shown_url: str
    client: Any  # a redmutex.Client of the same place, for what the core does (force release)
    cluster: bool = False


@dataclass
class Target:
    """Where a command looks: one node, or the N masters of a Redlock; the prefix."""

    nodes: list[Node]
    prefix: str
    redlock: bool = False

    @property
    def shown_url(self) -> str:
        return ",".join(node.shown_url for node in self.nodes)

    def keys(self, name: str | bytes) -> dict[str, bytes]:
        """Every key of `name` by role (the core's key layout)."""
        try:
            return _core._keys(self.prefix, name)
        except (ValueError, TypeError, UnicodeError) as exc:
            raise CliError(str(exc)) from None

    def close(self) -> None:
        for node in self.nodes:
            if node.conn is not None:
                node.conn.close()
            node.client.close()


def _urls(args: argparse.Namespace) -> tuple[list[str], bool]:
    """(URLs, cluster?) from --cluster, --redis (several times, or comma-separated), $REDIS_URL."""
    if args.cluster:
        if args.redis:
            raise CliError("give either --redis or --cluster, not both")
        return split_urls(args.cluster), True
    return split_urls(args.redis or [os.environ.get("REDIS_URL") or DEFAULT_URL]), False


def connect(args: argparse.Namespace) -> Target:
    import redmutex

    urls, cluster = _urls(args)
    if not urls:
        raise CliError("url: no Redis URL given")
    # The core's parser validates every URL (ValueError with the URL redacted); one Client per
    # node (per master of a Redlock), connecting only when used.
    options = {"prefix": args.prefix, "connect_timeout": TIMEOUT, "command_timeout": TIMEOUT}
    try:
        if cluster:
            clients = [redmutex.Client(cluster=urls, **options)]
        else:
            clients = [redmutex.Client(url, **options) for url in urls]
            if len(urls) > 1:
                redmutex.Client(urls, **options)  # refuses one master listed twice
        parts = [_core._parse_url(url) for url in urls]
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    shown = [_core._redact_url(url) for url in urls]
    redis_py = _redis_module()
    # One try: a command line reports a refused connection at once rather than retrying.
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if cluster:
        cluster_py: Any = importlib.import_module("redis.cluster")

        seeds = []
        for part in parts:
            kwargs = redis_kwargs(part)
            seeds.append(cluster_py.ClusterNode(kwargs.pop("host"), kwargs.pop("port")))
        kwargs.pop("db", None)
        node = Node(None, ",".join(shown), clients[0], cluster=True)
        # redis-py's cluster client reads the slot map from a seed as it is made.
        node.conn = _run(node, cluster_py.RedisCluster, startup_nodes=seeds, **kwargs)
        return Target([node], args.prefix)
    nodes = []
    for part, url_shown, client in zip(parts, shown, clients):
        if part["service"] is not None:
            sentinel_py: Any = importlib.import_module("redis.sentinel")
            sentinels, service, master, side = sentinel_kwargs(part)
            watch = sentinel_py.Sentinel(sentinels, sentinel_kwargs=side, **master)
            conn = watch.master_for(service, retry=Retry(NoBackoff(), 0), **master)
        else:
            kwargs = redis_kwargs(part)
            kwargs["retry"] = Retry(NoBackoff(), 0)
            conn = redis_py.Redis(**kwargs)
        nodes.append(Node(conn, url_shown, client))
    return Target(nodes, args.prefix, redlock=len(nodes) > 1)


def _core_failure(exc: Exception, node: Node) -> CliError:
    """One line for an error of the core (its messages never hold a password), worded as
    `_redis_failure` words redis-py's."""
    text = str(exc)
    if "NOAUTH" in text or "uthentication required" in text:
        return CliError(_AUTH_REQUIRED.format(node.shown_url))
    if "refused the credentials" in text or "AuthenticationFailed" in text:
        return CliError(_WRONG_CREDENTIALS.format(node.shown_url))
    if isinstance(exc, errors.ConnectionError):
        where = "Redis Cluster" if node.cluster else "Redis"
        return CliError(f"cannot reach {where} at {node.shown_url}: {text}")
    return CliError(f"Redis at {node.shown_url} answered with an error: {text}")


_AUTH_REQUIRED = (
    "Redis at {}: authentication required (put the user and password in the URL, before the"
    " host, separated by ':' and followed by '@')"
)
_WRONG_CREDENTIALS = "Redis at {} refused the credentials: wrong password or user"
_CLUSTER_NODE = (
    "Redis at {} is a Redis Cluster node, which holds only its own slots' names: "
    "give the cluster with --cluster URL[,URL...]"
)


def _redis_failure(exc: Exception, target: Target | Node) -> CliError:
    """One line for a redis-py error (its messages carry host and port, never the password)."""
    from redis import exceptions

    # Without a password redis-py's HELLO is refused ("HELLO must be called with the client
    # already authenticated ..."); with RESP2 a command gets NOAUTH.
    text = str(exc)
    if "NOAUTH" in text or "HELLO must be called" in text or "uthentication required" in text:
        return CliError(_AUTH_REQUIRED.format(target.shown_url))
    if isinstance(exc, exceptions.AuthenticationError) or "WRONGPASS" in str(exc):
        return CliError(_WRONG_CREDENTIALS.format(target.shown_url))
    if isinstance(exc, (exceptions.ConnectionError, exceptions.TimeoutError)):
        return CliError(f"cannot reach Redis at {target.shown_url}: {exc}")
    if isinstance(exc, (exceptions.MovedError, exceptions.AskError)):
        return CliError(_CLUSTER_NODE.format(target.shown_url))
    return CliError(f"Redis at {target.shown_url} answered with an error: {exc}")


def _pipeline(node: Node, transaction: bool) -> Any:
    pipe = node.conn.pipeline(transaction=transaction)
    if not node.cluster:
        pipe.time()
    return pipe


def _with_time(node: Node, key: bytes | None, pipe: Any) -> list[Any]:
    """[TIME, *replies of pipe]. On one server TIME goes into the pipeline (one snapshot); a
    cluster pipeline takes no key-less command, so TIME is asked of the node owning `key`."""
    if not node.cluster:
        return list(pipe.execute())
    if key is None:
        now = node.conn.time()
    else:
        now = node.conn.time(target_nodes=node.conn.get_node_from_key(key))
    return [now, *pipe.execute()]


def _run(target: Target | Node, func: Any, *args: Any, **kwargs: Any) -> Any:
    """`func(*args, **kwargs)` with redis-py's errors turned into one-line CliErrors."""
    from redis import exceptions

    try:
        return func(*args, **kwargs)
    except exceptions.RedisClusterException as exc:
        if "cannot be connected" in str(exc):
            raise CliError(f"cannot reach Redis Cluster at {target.shown_url}: {exc}") from None
        raise CliError(f"Redis Cluster at {target.shown_url}: {exc}") from None
    except exceptions.RedisError as exc:
        raise _redis_failure(exc, target) from None


# -- reading the state of one name -------------------------------------------------------------


def shown_name(name: str, limit: int = NAME_SHOWN) -> str:
    """A name as the text output shows it: at most `limit` characters, a name with control
    characters (it may hold newlines) in quotes with them escaped, as Python writes it (so it
    never reads like a printable name that spells the escapes), and a long one cut with its
    length said. Names may be megabytes long; only the part shown is looked at."""
    cut = len(name) > limit
    head = name[: limit + 1]
    if head.isprintable() and not cut:
        return name
    text = head if head.isprintable() else repr(head)
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


def _live_places(records: Iterable[bytes], now_ms: float) -> int:
    """How many of a lock's queue places (values '<seq> <deadline ms> <lease ms> <inbox>',
    src/protocol/lua/waitlist.lua) are still live."""
    live = 0
    for record in records:
        fields = record.split()
        if len(fields) >= 3 and fields[1].isdigit() and int(fields[1]) > now_ms:
            live += 1
    return live


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
    holds: int | None = None  # acquires the lock's hold stands for (more than 1: re-entered)
    fence: int | None = None
    waiters: int = 0
    semaphore: dict[str, Any] | None = None
    rwlock: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None
    # The other names the lock's holder holds with the same token (a MultiLock), if any.
    multi: list[str] | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def read_status(target: Target, node: Node, name: str) -> Status:
    """One consistent snapshot (MULTI/EXEC: all keys of a name share one cluster slot)."""
    k = target.keys(name)
    pipe = _pipeline(node, transaction=True)
    pipe.get(k["lock"])
    pipe.pttl(k["lock"])
    pipe.get(k["fence"])
    pipe.hvals(k["queue"])
    pipe.zrange(k["semaphore_holders"], 0, -1, withscores=True)
    pipe.zrange(k["semaphore_queue_deadlines"], 0, -1, withscores=True)
    pipe.exists(k["semaphore_holders"], k["semaphore_queue"])
    pipe.get(k["rw_writer"])
    pipe.pttl(k["rw_writer"])
    pipe.zrange(k["rw_readers"], 0, -1, withscores=True)
    pipe.zrange(k["rw_writers_waiting"], 0, -1, withscores=True)
    pipe.pttl(k["cache_value"])
    pipe.get(k["cache_fill"])
    pipe.pttl(k["cache_fill"])
    pipe.get(k["lock_holds"])
    (
        (seconds, micros),
        lock_token,
        lock_pttl,
        fence,
        lock_queue,
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
        lock_holds,
    ) = _run(node, _with_time, node, k["lock"], pipe)
    now_ms = seconds * 1000 + micros // 1000

    status = Status(name=name, prefix=target.prefix)
    status.lock = _hold_of_string(lock_token, lock_pttl)
    if lock_token is not None:
        status.holds = _core._hold_count(lock_holds, lock_token)
        others = _held_with(target, node, lock_token)
        status.multi = sorted(n for n in others if n != name) or None
    status.fence = int(fence) if fence is not None else None
    status.waiters = _live_places(lock_queue, now_ms)
    if sem_keys:
        status.semaphore = {
            "holders": [asdict(h) for h in _live(sem_holders, now_ms)],
            "waiters": len(_live(sem_places, now_ms)),
        }
    writer = _hold_of_string(writer_token, writer_pttl)
    live_readers = _live(readers, now_ms)
    # Each live place of a waiting writer holds new readers back (writer preference) until a
    # writer takes the lock or the place lapses: a live writer renews its place, a dead one's
    # lapses within its ttl (1 s to 6 s).
    writer_places = _live(writers_waiting, now_ms)
    if writer is not None or readers or writers_waiting:
        status.rwlock = {
            "writer": asdict(writer) if writer is not None else None,
            "readers": [asdict(h) for h in live_readers],
            "writers_waiting": len(writer_places),
            "writer_places": [asdict(h) for h in writer_places],
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


def _writer_places(status: Status) -> list[dict[str, Any]]:
    """The live places of the RWLock's waiting writers, soonest lapse first."""
    return list(status.rwlock["writer_places"]) if status.rwlock else []


def _places_lapse(places: Sequence[dict[str, Any]]) -> str:
    """When new readers get in at the latest, unless a waiting writer renews its place."""
    whose = "its place" if len(places) == 1 else "the last place"
    return f"{whose} lapses in {places[-1]['remaining']:.3f} s unless renewed"


def _readers_held_back(places: Sequence[dict[str, Any]]) -> str:
    """Why a new reader waits although nobody may hold the RWLock: its waiting writers."""
    waits = "1 writer waits" if len(places) == 1 else f"{len(places)} writers wait"
    return f"new readers are held back: {waits} ({_places_lapse(places)})"


def status_lines(status: Status) -> Iterator[str]:
    yield f"name:      {shown_name(status.name)}   (prefix {status.prefix!r})"
    places = _writer_places(status)
    state = "held" if status.held else "free"
    if places:
        # Not "free" alone: a reader asking why it cannot get in learns what holds it back.
        state += ("; " if status.held else ", but ") + _readers_held_back(places)
    yield f"state:     {state}"
    if status.lock is not None:
        nested = f", hold count {status.holds}" if (status.holds or 1) > 1 else ""
        yield f"lock:      held by {_lease(status.lock)}{nested}"
    elif status.fence is not None or status.waiters:
        yield "lock:      free"
    if status.multi:
        others = ", ".join(shown_name(n, 40) for n in status.multi[:HOLDERS_SHOWN])
        more = (
            f", and {len(status.multi) - HOLDERS_SHOWN} more"
            if len(status.multi) > HOLDERS_SHOWN
            else ""
        )
        yield f"multi:     held together with {len(status.multi)} other name(s): {others}{more}"
    if status.fence is not None:
        yield f"fence:     {status.fence}"
    if status.waiters:
        yield f"waiting:   {status.waiters} in the queue"
    if status.semaphore is not None:
        yield f"semaphore: holders {_holders_line(status.semaphore['holders'])}"
        if status.semaphore["waiters"]:
            yield f"           {status.semaphore['waiters']} waiting"
    if status.rwlock is not None:
        writer = status.rwlock["writer"]
        yield f"rwlock:    writer {_lease(writer) if writer else 'none'}"
        yield f"           readers {_holders_line(status.rwlock['readers'])}"
        if places:
            yield f"           writers waiting {_holders_line(places)}"
            yield (
                "           (a live waiting writer renews its place, a dead one's lapses;"
                " release --force drops them)"
            )
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


@dataclass
class Entry:
    name: str
    kind: str
    keys: dict[str, bytes]  # by role, of the name's own bytes (even when not valid UTF-8)
    roles: set[str] = field(default_factory=set)
    state: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def scan_entries(target: Target, node: Node) -> list[Entry]:
    """Every primitive under the prefix, found with SCAN (never KEYS), sorted by name and kind."""
    pattern = _core._scan_pattern(target.prefix)
    found: dict[tuple[bytes, str], Entry] = {}
    # One node of a cluster given as --redis would list only its own slots' names.
    if not node.cluster and _run(node, node.conn.info, "cluster").get("cluster_enabled"):
        raise CliError(_CLUSTER_NODE.format(node.shown_url))
    keys = _run(node, lambda: list(node.conn.scan_iter(match=pattern, count=SCAN_COUNT)))
    for key in keys:
        parsed = _core._split_key(target.prefix, key)
        if parsed is None:
            continue
        raw, kind, role = parsed
        entry = found.get((raw, kind))
        if entry is None:
            name = raw.decode("utf-8", "replace")
            entry = found[(raw, kind)] = Entry(name, kind, target.keys(raw))
        entry.roles.add(role)
    kinds = _core._kinds()
    entries = sorted(found.values(), key=lambda e: (e.name, kinds.index(e.kind)))
    _describe(node, entries)
    _count_holds(node, entries)
    _mark_multi_holds(node, entries)
    return entries


def _count_holds(node: Node, entries: list[Entry]) -> None:
    """The hold count of each held lock whose hold count key SCAN found (a re-entered lock)."""
    nested = [e for e in entries if e.kind == "lock" and "lock_holds" in e.roles]
    nested = [e for e in nested if e.detail.get("held")]
    if not nested:
        return
    pipe = _pipeline(node, transaction=False)
    for entry in nested:
        pipe.get(entry.keys["lock"])
        pipe.get(entry.keys["lock_holds"])
    replies = _run(node, _with_time, node, None, pipe)
    for i, entry in enumerate(nested):
        token, value = replies[1 + 2 * i], replies[2 + 2 * i]
        count = _core._hold_count(value, token) if token is not None else 1
        if count > 1:
            entry.detail["holds"] = count
            entry.state += f", hold count {count}"


def _lock_tokens(node: Node, keys: list[bytes]) -> list[bytes | None]:
    """The token in each lock key (None: free, or not a plain token)."""
    tokens: list[bytes | None] = []
    batch = 200
    for start in range(0, len(keys), batch):
        pipe = node.conn.pipeline(transaction=False)
        for key in keys[start : start + batch]:
            pipe.get(key)
        replies = _run(node, pipe.execute, raise_on_error=False)
        tokens += [r if isinstance(r, bytes) else None for r in replies]
    return tokens


def _mark_multi_holds(node: Node, entries: list[Entry]) -> None:
    """Lock names that one token holds together (a MultiLock) say so, each naming the others."""
    held = [e for e in entries if e.kind == "lock" and e.detail.get("held")]
    groups: dict[bytes, list[Entry]] = {}
    for entry, token in zip(held, _lock_tokens(node, [e.keys["lock"] for e in held])):
        if token is not None:
            groups.setdefault(token, []).append(entry)
    for token, group in groups.items():
        if len(group) < 2:
            continue
        for entry in group:
            entry.detail["multi"] = [e.name for e in group if e is not entry]
            entry.state += f", multi-hold of {len(group)} names by {_short(token)}..."


def _held_with(target: Target, node: Node, token: bytes) -> list[str]:
    """Every lock name under the prefix that `token` holds (found with SCAN, never KEYS)."""
    pattern = _core._scan_pattern(target.prefix)
    keys = _run(
        node, lambda: list(node.conn.scan_iter(match=pattern + b"}:lock", count=SCAN_COUNT))
    )
    locks: list[tuple[str, bytes]] = []
    for key in keys:
        parsed = _core._split_key(target.prefix, key)
        if parsed is not None and parsed[1] == "lock" and parsed[2] == "lock":
            locks.append((parsed[0].decode("utf-8", "replace"), key))
    tokens = _lock_tokens(node, [key for _, key in locks])
    return [name for (name, _), found in zip(locks, tokens) if found == token]


def _describe(node: Node, entries: list[Entry]) -> None:
    """Fill in each entry's state with one pipeline per batch of entries."""
    batch = 200
    for start in range(0, len(entries), batch):
        chunk = entries[start : start + batch]
        pipe = _pipeline(node, transaction=False)
        for entry in chunk:
            k = entry.keys
            if entry.kind == "lock":
                pipe.pttl(k["lock"])
                pipe.get(k["fence"])
                pipe.hvals(k["queue"])
            elif entry.kind == "semaphore":
                pipe.zrange(k["semaphore_holders"], 0, -1, withscores=True)
                pipe.zrange(k["semaphore_queue_deadlines"], 0, -1, withscores=True)
                pipe.exists(k["semaphore_holders"])  # keeps three replies per entry
            elif entry.kind == "rwlock":
                pipe.pttl(k["rw_writer"])
                pipe.zrange(k["rw_readers"], 0, -1, withscores=True)
                pipe.zrange(k["rw_writers_waiting"], 0, -1, withscores=True)
            else:
                pipe.pttl(k["cache_value"])
                pipe.pttl(k["cache_fill"])
                pipe.exists(k["cache_value"])
        replies = _run(node, _with_time, node, None, pipe)
        seconds, micros = replies[0]
        now_ms = seconds * 1000 + micros // 1000
        for i, entry in enumerate(chunk):
            a, b, c = replies[1 + 3 * i : 4 + 3 * i]
            _state(entry, a, b, c, now_ms)


def _state(entry: Entry, a: Any, b: Any, c: Any, now_ms: float) -> None:
    if entry.kind == "lock":
        held = a != -2
        waiting = _live_places(c, now_ms)
        entry.detail = {
            "held": held,
            "holds": 1 if held else 0,
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
        if waiting and not writer:
            # Writer preference: a waiting writer's place keeps new readers out (see `status`).
            entry.state += " (new readers held back)"
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


def reader_gone(out: TextIO) -> bool:
    """Whether the reader of `out` went away (a pipe whose reading end is closed, as after
    `| head`): a BrokenPipeError then came from `out`, not from another pipe."""
    poll = getattr(select, "poll", None)
    if poll is None:
        return True
    watch = poll()
    watch.register(out.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in watch.poll(0))


def discard_output(out: TextIO) -> None:
    """After the reader of `out` went away: what is still written to it goes to /dev/null, so
    Python does not fail again flushing it at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, out.fileno())
    os.close(devnull)


def _write(text: str, out: TextIO | None = None) -> None:
    """Writes to stdout; a reader that went away (`| head`) is not an error of ours."""
    out = out or sys.stdout
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        discard_output(out)


def _print(*lines: str) -> None:
    _write("".join(line + "\n" for line in lines))


def _print_json(data: Any) -> None:
    _write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _each_node(target: Target, func: Any) -> list[tuple[Node, Any]]:
    """`func(node)` on every node. On a Redlock a master that fails is left out (its error is
    its result) as long as one answers; when none does, the first error is raised."""
    results: list[tuple[Node, Any]] = []
    for node in target.nodes:
        try:
            results.append((node, func(node)))
        except CliError as exc:
            if not target.redlock:
                raise
            results.append((node, exc))
    if all(isinstance(r, CliError) for _, r in results):
        raise results[0][1]
    return results


def _quorum(target: Target) -> int:
    return len(target.nodes) // 2 + 1


def cmd_status(args: argparse.Namespace) -> int:
    target = connect(args)
    try:
        results = _each_node(target, lambda node: read_status(target, node, args.name))
    finally:
        target.close()
    if not target.redlock:
        status = results[0][1]
        if args.json:
            _print_json(status.as_json())
        else:
            _print(*status_lines(status))
        return EXIT_HELD if status.held else EXIT_FREE
    # A Redlock: each master's view; held when a quorum of masters says so, free when so many
    # say free that no quorum can hold it, else unknown (too few answered): an error.
    held_on = sum(1 for _, r in results if isinstance(r, Status) and r.held)
    free_on = sum(1 for _, r in results if isinstance(r, Status) and not r.held)
    quorum = _quorum(target)
    held: bool | None = True if held_on >= quorum else None
    if held is None and free_on > len(results) - quorum:
        held = False
    shown = {True: "held", False: "free", None: "unknown: too few masters answered"}[held]
    if args.json:
        masters = [
            {"url": node.shown_url, "error": str(r)}
            if isinstance(r, CliError)
            else {"url": node.shown_url, **r.as_json()}
            for node, r in results
        ]
        _print_json(
            {
                "name": args.name,
                "prefix": target.prefix,
                "held": held,
                "held_on": held_on,
                "free_on": free_on,
                "quorum": quorum,
                "masters": masters,
            }
        )
    else:
        lines = [
            (
                f"redlock:   {shown} (held on {held_on}, free on {free_on} of"
                f" {len(results)} masters, quorum {quorum})"
            )
        ]
        for i, (node, r) in enumerate(results, 1):
            lines.append(f"-- master {i}: {node.shown_url}")
            lines += [f"error:     {r}"] if isinstance(r, CliError) else list(status_lines(r))
        _print(*lines)
    if held is None:
        # Exit 2 like every error, with its one line on stderr (stdout said what each master
        # answered).
        failed = [r for _, r in results if isinstance(r, CliError)]
        raise CliError(
            f"cannot tell whether it is held: held on {held_on}, free on {free_on} of"
            f" {len(results)} masters, quorum {quorum}; {len(failed)} failed, the first: {failed[0]}"
        )
    return EXIT_HELD if held else EXIT_FREE


def _active(entry: Entry) -> bool:
    """Held, queued for, or (a cache entry) storing a value: not just an idle fence counter."""
    d = entry.detail
    return any(d.get(k) for k in ("held", "waiters", "writers_waiting", "stored"))


def cmd_list(args: argparse.Namespace) -> int:
    target = connect(args)
    try:
        results = _each_node(target, lambda node: scan_entries(target, node))
    finally:
        target.close()
    if not args.all:
        results = [
            (node, r if isinstance(r, CliError) else [e for e in r if _active(e)])
            for node, r in results
        ]
    if args.json:
        rows = []
        for node, entries in results:
            if isinstance(entries, CliError):
                rows.append({"master": node.shown_url, "error": str(entries)})
                continue
            for e in entries:
                row = {"name": e.name, "kind": e.kind, **e.detail}
                if target.redlock:
                    row["master"] = node.shown_url
                rows.append(row)
        _print_json(rows)
        return EXIT_OK
    for node, entries in results:
        if target.redlock:
            _print(f"-- master {node.shown_url}")
        if isinstance(entries, CliError):
            _print(f"error: {entries}")
        elif not entries:
            idle = "" if args.all else " held or queued (--all also shows idle fence counters)"
            _print(f"nothing under the prefix {target.prefix!r}{idle}")
        else:
            _print(*_table(entries))
    return EXIT_OK


def _table(entries: list[Entry]) -> list[str]:
    # Names are shortened to NAME_SHOWN characters, so a name of megabytes neither widens
    # every row nor floods the terminal.
    names = [shown_name(e.name) for e in entries]
    width = max(len("NAME"), *(len(n) for n in names))
    return [
        f"{'KIND':<10} {'NAME':<{width}}  STATE",
        *(f"{e.kind:<10} {n:<{width}}  {e.state}" for e, n in zip(entries, names)),
    ]


def _confirm(question: str) -> bool:
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


@dataclass
class Freed:
    """What a forced release took away on one node."""

    lock: str | None = None  # first characters of the lock holder's token
    semaphore: int = 0  # live semaphore holders
    writer: str | None = None
    readers: int = 0
    fill: str | None = None
    writers_waiting: int = 0  # live places of waiting RWLock writers (they hold readers back)

    def any(self) -> bool:
        return bool(
            self.lock
            or self.semaphore
            or self.writer
            or self.readers
            or self.fill
            or self.writers_waiting
        )

    def add(self, other: Freed) -> None:
        """Counts the holders freed on another Redlock master (tokens: the first seen)."""
        self.lock = self.lock or other.lock
        self.writer = self.writer or other.writer
        self.fill = self.fill or other.fill
        self.semaphore = max(self.semaphore, other.semaphore)
        self.readers = max(self.readers, other.readers)
        self.writers_waiting = max(self.writers_waiting, other.writers_waiting)

    def phrases(self, name: str) -> list[str]:
        said = []
        if self.lock:
            said.append(f"released lock {name!r} (held by {self.lock}...)")
        if self.semaphore:
            s = "s" if self.semaphore != 1 else ""
            said.append(f"freed semaphore {name!r}: {self.semaphore} holder{s}")
        if self.writer or self.readers:
            sides = ([f"writer {self.writer}..."] if self.writer else []) + (
                [f"{self.readers} reader{'s' if self.readers != 1 else ''}"] if self.readers else []
            )
            said.append(f"freed rwlock {name!r}: {', '.join(sides)}")
        if self.writers_waiting:
            s = "s" if self.writers_waiting != 1 else ""
            said.append(
                f"dropped {self.writers_waiting} waiting writer place{s} of rwlock {name!r}"
                " (a live writer takes its place again)"
            )
        if self.fill:
            said.append(f"freed the cache fill claim of {name!r} (held by {self.fill}...)")
        return said


def _force_release(node: Node, name: str, expected: bytes) -> Freed:
    """The core's forced release on one node (`--force`); the lock only while `expected` (if
    not empty) still holds it."""
    try:
        freed = _core._force_release(node.client, name, expected)
    except errors.LockError as exc:
        raise _core_failure(exc, node) from None
    if freed is None:
        raise CliError("the holder changed meanwhile; nothing released")
    lock, holders, writer, readers, fill, writers_waiting = freed
    return Freed(
        lock=_short(lock) if lock else None,
        semaphore=holders,
        writer=_short(writer) if writer else None,
        readers=readers,
        fill=_short(fill) if fill else None,
        writers_waiting=writers_waiting,
    )


def cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        raise CliError(
            "release breaks somebody else's lock: pass --force (the holder will get"
            " LockLostError on its next extend or release)"
        )
    target = connect(args)
    try:
        lock_key = target.keys(args.name)["lock"]
        expected: dict[int, bytes] = {}
        if not args.yes and sys.stdin.isatty():
            # Ask with what each node holds now; the lock is then released only if its holder
            # is still the one the user saw.
            seen = _each_node(target, lambda node: read_status(target, node, args.name))
            held = [(n, st) for n, st in seen if isinstance(st, Status) and _releasable(st)]
            if not held:
                return _not_released(args, "nothing is held under this name")
            # A Redlock master that cannot be read now is left to the release, as with --yes
            # (its error is not fatal while another master answers).
            tokens = _each_node(target, lambda node: _run(node, node.conn.get, lock_key))
            for i, (_, token) in enumerate(tokens):
                expected[i] = b"" if isinstance(token, CliError) else token or b""
            what = _held_summary(held[0][1])
            if not _confirm(f"Release {what}?"):
                return _not_released(args, "not confirmed")
        freed = Freed()
        done = _each_node(
            target,
            lambda node: _force_release(
                node, args.name, expected.get(target.nodes.index(node), b"")
            ),
        )
    finally:
        target.close()
    masters = 0
    for _, result in done:
        if isinstance(result, Freed) and result.any():
            freed.add(result)
            masters += 1
    if not freed.any():
        return _not_released(args, "it is not held")
    if args.json:
        data: dict[str, Any] = {
            "name": args.name,
            "released": True,
            "holder": freed.lock,
            "semaphore_holders": freed.semaphore,
            "writer": freed.writer,
            "readers": freed.readers,
            "fill": freed.fill,
            "writers_waiting": freed.writers_waiting,
        }
        if target.redlock:
            data["masters"] = masters
        _print_json(data)
    else:
        on = f" on {masters} of {len(target.nodes)} masters" if target.redlock else ""
        _print("; ".join(freed.phrases(args.name)) + f"{on}; waiters woken")
    return EXIT_OK


def _releasable(status: Status) -> bool:
    """Something a forced release would free: a holder, or a waiting writer's place (which
    holds new readers back though nobody holds the RWLock)."""
    return status.held or bool(_writer_places(status))


def _held_summary(status: Status) -> str:
    parts = []
    if status.lock is not None:
        parts.append(f"lock {status.name!r} held by {_lease(status.lock)}")
    if status.semaphore and status.semaphore["holders"]:
        parts.append(f"semaphore {status.name!r} ({len(status.semaphore['holders'])} holders)")
    if status.rwlock and (status.rwlock["writer"] or status.rwlock["readers"]):
        parts.append(f"rwlock {status.name!r}")
    places = _writer_places(status)
    if places:
        s = "s" if len(places) != 1 else ""
        parts.append(
            f"{len(places)} waiting writer place{s} of rwlock {status.name!r}"
            f" (new readers are held back; {_places_lapse(places)})"
        )
    if status.cache and status.cache["filling"]:
        parts.append(f"the cache fill claim of {status.name!r}")
    return ", ".join(parts)


def _not_released(args: argparse.Namespace, why: str) -> int:
    if args.json:
        _print_json({"name": args.name, "released": False, "reason": why})
    else:
        _print(f"{args.name!r} not released: {why}")
    return EXIT_FREE


# -- wiring into `python -m redmutex` ----------------------------------------------------------


URL_HELP = (
    "Redis URL: redis://, rediss://, redis+unix://, unix:// or"
    " redis+sentinel://[user:pass@]host[:port][,host[:port]...]/service[/db]. Give --redis several"
    " times, or URLs separated by commas, for the masters of a Redlock (default: $REDIS_URL,"
    f" else {DEFAULT_URL})"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL", action="append", help=URL_HELP)
    parser.add_argument(
        "--cluster",
        metavar="URL[,URL...]",
        action="append",
        help="seed nodes of a Redis Cluster (one is enough; may be given several times)",
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
        " fencing counter and the queued waiters of the lock NAME, plus semaphore"
        " holders, read-write lock readers/writer, the places of its waiting writers (each"
        " holds new readers back until it lapses or its writer gets in; the state line says"
        " so even when nobody holds it) and the cache entry stored under NAME."
        " Exit code: 0 held, 1 free (also when only waiting writers' places are left), 2 error.",
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
        help="break whatever is held under NAME and wake its waiters (needs --force)",
        description="Frees everything held under NAME, whoever holds it: the lock, the"
        " semaphore's holders, the read-write lock's writer, readers and waiting writers'"
        " places (a live waiting writer takes its place again), the cache entry's fill"
        " claim; then wakes their waiters, as a release would. Holders are not told: their next"
        " extend or release raises LockLostError. Asks for confirmation on a terminal unless"
        " --yes. Says what it freed (e.g. \"freed semaphore 's': 3 holders\"). Exit code: 0"
        " something freed, 1 nothing freed (nothing held, or not confirmed), 2 error.",
    )
    release.add_argument("name", metavar="NAME")
    release.add_argument("--force", action="store_true", help="required: yes, break it")
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    _common(release)
    release.set_defaults(handler=cmd_release)
