"""A server at its `maxclients` refuses new connections ("max number of clients reached", then
closes): that is redmutex.ConnectionError, what a retry on an unreachable server catches,
whatever call opened the connection. A try-once acquire on a fresh client raised a plain
LockError quoting the reply.

The test starts its own redis-server (a full server would stall other tests) and stops it by
its PID.
"""

from __future__ import annotations

import pytest
import redis
import redmutex
from redmutex._server import RedisServer

pytestmark = pytest.mark.timeout(60)


def test_a_server_at_maxclients_is_a_connection_error() -> None:
    server = RedisServer().start()
    try:
        with redis.Redis(port=server.port) as admin:
            admin.ping()
            admin.config_set("maxclients", "1")  # this connection is the one
            client = redmutex.Client(server.url, connect_timeout=1, command_timeout=1)
            try:
                for call in (
                    lambda: redmutex.Lock(client, "full", ttl=5).acquire(timeout=0),
                    lambda: redmutex.Semaphore(client, "full", 2, ttl=5).acquire(timeout=0),
                    client.ping,
                ):
                    with pytest.raises(redmutex.ConnectionError):
                        call()
                admin.config_set("maxclients", "100")
                assert redmutex.Lock(client, "full", ttl=5).acquire(timeout=5)
            finally:
                client.close()
    finally:
        server.close()
