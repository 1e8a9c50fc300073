"""Every TCP connection the library opens has TCP keepalive (first probe after 30 s idle).

A connection kept idle for the next call or wait, or a subscriber waiting out a long hold, must
not be dropped silently by a NAT or load balancer on the way (their idle timeouts are minutes),
and a server gone without a word must be noticed, so that the next call opens a new connection
instead of waiting its command timeout out on a dead one.

A child process (only its own connections are looked at) uses every kind of connection: the
blocking calls' direct one, a blocking waiter's subscriber, the runtime's (asyncio) and the
asyncio waiters' subscriber. Then its sockets to the server are read from /proc/net/tcp: an idle
socket with keepalive shows its keepalive timer running (timer kind 2), one without shows none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the sockets' timers from /proc/net/tcp"
)

_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys, threading, time
    import redmutex, redmutex.aio

    url, prefix = sys.argv[1], sys.argv[2]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    client = redmutex.Client(url, prefix=prefix)

    # Blocking: the direct connection, and a waiter's subscriber.
    holder = redmutex.Lock(client, "ka", ttl=5)
    assert holder.acquire(timeout=5)
    threading.Timer(0.3, holder.release).start()
    waiter = redmutex.Lock(client, "ka", ttl=5)
    assert waiter.acquire(timeout=5)
    waiter.release()

    # asyncio: the runtime's connection, and a waiter's subscriber there.
    async def contended() -> None:
        first = redmutex.aio.Lock(client, "ka-aio", ttl=5)
        await first.acquire()
        async def later() -> None:
            await asyncio.sleep(0.3)
            await first.release()
        task = asyncio.ensure_future(later())
        second = redmutex.aio.Lock(client, "ka-aio", ttl=5)
        assert await second.acquire(timeout=5)
        await second.release()
        await task

    asyncio.run(contended())
    time.sleep(0.5)  # every socket idle: its keepalive timer (if any) is the one running

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                established = fields[3] == "01"
                if fields[9] in inodes and remote_port == port and established:
                    timer, when = fields[5].split(":")
                    rows.append({"timer": int(timer, 16), "ticks": int(when, 16)})
    print(json.dumps({"rows": rows, "hz": os.sysconf("SC_CLK_TCK")}))
    """
)


@pytest.mark.timeout(60)
def test_every_connection_has_keepalive(redis_url: str, prefix: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, redis_url, prefix],
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    rows = report["rows"]
    # The direct connection, the blocking waiter's subscriber, the runtime's connection and the
    # asyncio waiter's subscriber at least.
    assert len(rows) >= 4, rows
    # Timer kind 2: keepalive (0: no timer at all). Its first probe within 30 s.
    assert all(row["timer"] == 2 for row in rows), rows
    assert all(row["ticks"] <= 30 * report["hz"] for row in rows), rows
