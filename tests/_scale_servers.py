"""Multi-server set-ups for the scale-out tests and benchmarks, all on loopback.

- `Cluster`: N masters joined with `redis-cli --cluster create ... --cluster-yes`.
- `Masters`: N independent redis-servers (Redlock), each stoppable and restartable (empty).
- `SentinelGroup`: one master, one replica, one sentinel.

Every process is started by us and stopped by its PID only (through `RedisServer`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis
from redmutex._server import RedisServer, free_port

if TYPE_CHECKING:
    from typing_extensions import Self


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Calls `check` until it returns something truthy (errors count as not yet)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last!r})")


def redis_cli() -> str:
    binary = shutil.which("redis-cli")
    if binary is None:
        raise RuntimeError("redis-cli is not installed (make deps installs it)")
    return binary


class Cluster:
    """A Redis Cluster of `size` masters (no replicas) on free loopback ports."""

    def __init__(self, size: int = 3) -> None:
        self.servers = [
            RedisServer(
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000",
                    # The bus port defaults to port + 10000, which may be taken or too large.
                    "--cluster-port", str(free_port()),
                ]
            )
            for _ in range(size)
        ]  # fmt: skip

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> Self:
        try:
            for server in self.servers:
                server.start()
            addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
            subprocess.run(
                [redis_cli(), "--cluster", "create", *addresses, "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            wait_for("the cluster to settle", self.settled, timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def conn(self, server: RedisServer) -> redis.Redis:
        return redis.Redis(port=server.port, socket_timeout=5)

    def settled(self) -> bool:
        """Every node says the cluster is ok and they all agree on who owns slot 0..16383."""
        views = []
        for server in self.servers:
            with self.conn(server) as r:
                info = r.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                views.append(
                    sorted((s[0], s[1], s[2][1]) for s in r.execute_command("CLUSTER SLOTS"))
                )
        return all(v == views[0] for v in views)

    def node_id(self, server: RedisServer) -> str:
        with self.conn(server) as r:
            return str(r.execute_command("CLUSTER", "MYID").decode())

    def owner(self, slot: int) -> RedisServer:
        with self.conn(self.servers[0]) as r:
            for start, end, master, *_ in r.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    port = int(master[1])
                    return next(s for s in self.servers if s.port == port)
        raise LookupError(slot)

    def lowest_slot(self, server: RedisServer) -> int:
        with self.conn(server) as r:
            ranges = [
                (start, end)
                for start, end, master, *_ in r.execute_command("CLUSTER SLOTS")
                if int(master[1]) == server.port
            ]
        return min(start for start, _ in ranges)

    def reshard_lowest_slot(self, source: RedisServer, target: RedisServer) -> None:
        """`redis-cli --cluster reshard` of one slot: it moves the lowest slot of `source`."""
        subprocess.run(
            [
                redis_cli(), "--cluster", "reshard", f"127.0.0.1:{source.port}",
                "--cluster-from", self.node_id(source),
                "--cluster-to", self.node_id(target),
                "--cluster-slots", "1",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        wait_for("the cluster to settle after resharding", self.settled, timeout=30)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Masters:
    """`size` independent redis-servers, each stoppable and restartable (empty, no persistence)."""

    def __init__(self, size: int = 5) -> None:
        self.servers = [RedisServer() for _ in range(size)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> Self:
        try:
            for server in self.servers:
                server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop_one(self, index: int) -> None:
        self.servers[index].stop()

    def start_one(self, index: int) -> None:
        """Starts master `index` again on its port: a new run_id and an empty dataset."""
        old = self.servers[index]
        old.stop()
        self.servers[index] = RedisServer(port=old.port).start()

    def conn(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.servers[index].port, socket_timeout=5)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SentinelGroup:
    """One master, one replica and one sentinel watching them as service `name`."""

    def __init__(self, name: str = "mymaster") -> None:
        self.name = name
        self.master = RedisServer()
        self.replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(self.master.port)])
        self.dir = tempfile.mkdtemp(prefix="redmutex-sentinel-")
        self.config = os.path.join(self.dir, "sentinel.conf")
        with open(self.config, "w") as f:
            f.write(
                f"sentinel monitor {name} 127.0.0.1 {self.master.port} 1\n"
                f"sentinel down-after-milliseconds {name} 5000\n"
                f"sentinel failover-timeout {name} 20000\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
        self.sentinel = RedisServer(config_file=self.config, extra_args=["--sentinel"])

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.name}"

    def start(self) -> Self:
        try:
            self.master.start()
            self.replica.start()
            wait_for("the replica to sync", self.replica_synced, timeout=30)
            self.sentinel.start()
            wait_for("the sentinel to see the replica", self.sentinel_sees_replica, timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def sentinel_conn(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel.port, socket_timeout=5, decode_responses=True)

    def replica_synced(self) -> bool:
        with redis.Redis(port=self.replica.port, socket_timeout=5) as r:
            return bool(r.info("replication").get("master_link_status") == "up")

    def sentinel_sees_replica(self) -> bool:
        with self.sentinel_conn() as s:
            replicas = s.execute_command("SENTINEL", "REPLICAS", self.name)
            return bool(replicas)

    def master_port(self) -> int:
        with self.sentinel_conn() as s:
            _, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            return int(port)

    def failover(self) -> None:
        """SENTINEL FAILOVER, once the sentinel has the replica's own INFO (before that it
        answers NOGOODSLAVE)."""

        def ask() -> bool:
            with self.sentinel_conn() as s:
                return bool(s.execute_command("SENTINEL", "FAILOVER", self.name))

        wait_for("the sentinel to accept a failover", ask, timeout=30)

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.master):
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
