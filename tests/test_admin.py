"""What the command line takes from the core (`_core._keys`, `_split_key`, `_scan_pattern`,
`_parse_url`, `_redact_url`, `_redact_text`, `_force_release`) instead of keeping copies."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
import redmutex
from _helpers import wait_until
from redmutex import _core


def test_keys_are_the_layout_of_the_primitives(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    name = f"adm-{uuid.uuid4().hex[:8]}"
    keys = _core._keys(prefix, name)
    with redmutex.Lock(client, name, ttl=30) as lock:
        assert r.get(keys["lock"]) == (lock.token or "").encode()
        assert int(r.get(keys["fence"]) or 0) == lock.fence
    with redmutex.Semaphore(client, name, 2, ttl=30) as sem:
        assert r.zscore(keys["semaphore_holders"], sem.token or "") is not None
    assert keys["wake_channel"] == (prefix + "{" + name + "}:wake").encode()
    for role, key in keys.items():
        if role == "wake_channel":
            continue
        found = _core._split_key(prefix, key)
        assert found is not None and found[0] == name.encode() and found[2] == role
        assert found[1] in _core._kinds()
    assert _core._keys(prefix, b"\xff") == _core._keys(prefix, b"\xff")  # raw bytes as found
    assert _core._split_key(prefix, (prefix + "{n}:wake").encode()) is None
    assert _core._scan_pattern("a*[b]:") == b"a\\*\\[b\\]:{*"
    with pytest.raises(ValueError, match="name: must not be empty"):
        _core._keys(prefix, "")


def test_urls_are_read_and_redacted_as_the_client_reads_them() -> None:
    parts = _core._parse_url("rediss://u:p/w@h:7/3?ssl_cert_reqs=none#insecure")
    assert parts["hosts"] == [("h", 7)] and parts["db"] == 3
    assert (parts["username"], parts["password"]) == ("u", "p/w")
    assert parts["tls"] and parts["insecure"] and not parts["ssl_verify_peer"]
    parts = _core._parse_url("unix:///tmp/x.sock?db=2&pass=s3")
    assert (parts["socket"], parts["db"], parts["password"]) == ("/tmp/x.sock", 2, "s3")
    parts = _core._parse_url("redis+sentinel://:pw@a,b:5/svc/1?sentinel_password=sp")
    assert parts["hosts"] == [("a", 26379), ("b", 5)] and parts["service"] == "svc"
    assert (parts["db"], parts["password"], parts["sentinel_password"]) == (1, "pw", "sp")
    with pytest.raises(ValueError) as caught:
        _core._parse_url("redis://:hunter2@h/x")
    assert "hunter2" not in str(caught.value)
    assert _core._redact_url("redis://u:hunter2@h/0") == "redis://u:***@h/0"
    text = _core._redact_text("x\n  'redis://:a@h' hunter2", ["redis://:hunter2@h"])
    assert text == "x 'redis://:***@h' ***"


def test_force_release_only_frees_the_expected_holder(
    client: redmutex.Client, redis_url: str
) -> None:
    name = f"adm-{uuid.uuid4().hex[:8]}"
    lock = redmutex.Lock(client, name, ttl=30)
    assert lock.acquire(timeout=5)
    assert _core._force_release(client, name, b"somebody else") is None
    assert lock.owned()
    freed = _core._force_release(client, name, (lock.token or "").encode())
    assert freed == ((lock.token or "").encode(), 0, None, 0, None, 0)
    assert not lock.locked()
    assert _core._force_release(client, name) == (None, 0, None, 0, None, 0)
    with pytest.raises(ValueError, match="client"):
        _core._force_release(redmutex.Client([redis_url, "redis://127.0.0.1:1/0"]), name)


def test_force_release_frees_a_reentrant_locks_hold_counts(
    client: redmutex.Client, r: redis.Redis
) -> None:
    name = f"adm-{uuid.uuid4().hex[:8]}"
    lock = redmutex.Lock(client, name, ttl=30, reentrant=True)
    assert lock.acquire(timeout=5)
    assert lock.acquire(timeout=5)  # nested: the server now counts two holds
    holds = list(r.scan_iter(match=f"*{{{name}}}:lock:holds"))
    assert len(holds) == 1
    assert _core._force_release(client, name) is not None
    assert not r.exists(holds[0])
    assert not lock.locked()


def test_force_release_drops_the_semaphores_limit_unless_a_waiter_keeps_it(
    client: redmutex.Client, r: redis.Redis
) -> None:
    """The live limit goes with the last permit, as a release's would: left behind, it outlived
    every holder for the rest of their leases."""
    name = f"adm-{uuid.uuid4().hex[:8]}"
    limit = _core._keys(client.prefix, name)["semaphore_limit"]
    sem = redmutex.Semaphore(client, name, 1, ttl=30)
    assert sem.acquire(timeout=5)
    assert r.exists(limit)
    assert _core._force_release(client, name) == (None, 1, None, 0, None, 0)
    assert not r.exists(limit)
    holder = redmutex.Semaphore(client, name, 1, ttl=30)
    assert holder.acquire(timeout=5)
    waiter = redmutex.Semaphore(client, name, 1, ttl=30)
    waiting = threading.Thread(target=lambda: waiter.acquire(timeout=20))
    waiting.start()
    try:
        deadlines = _core._keys(client.prefix, name)["semaphore_queue_deadlines"]
        wait_until(lambda: bool(r.exists(deadlines)), 10, "the waiter's place")
        assert _core._force_release(client, name) == (None, 1, None, 0, None, 0)
        assert r.exists(limit)  # the waiter waits under that limit and takes the freed permit
        waiting.join(20)
        assert waiter.token is not None
    finally:
        waiting.join(20)
        if waiter.token is not None:
            waiter.release()
    assert not r.exists(limit)
