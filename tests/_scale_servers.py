"""Multi-server set-ups for the scale-out tests and benchmarks, all on loopback.

- `Cluster`: N masters (and optionally a replica each) joined with `redis-cli --cluster create`.
- `Masters`: N independent redis-servers (Redlock), each stoppable and restartable (empty).
- `SentinelGroup`: one master, one replica, one sentinel (or several, optionally over TLS).

Every process is started by us and stopped by its PID only (through `RedisServer`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis
import redmutex
from redmutex._server import FREE_PORT, RedisServer, free_port

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
    """A Redis Cluster of `size` masters on free loopback ports; with `replicas=1`, each master
    has a replica (`servers` then lists 2 * size nodes, masters and replicas as redis-cli paired
    them) and `node_timeout_ms` decides how soon a dead master's replica takes over."""

    def __init__(self, size: int = 3, replicas: int = 0, node_timeout_ms: int = 5000) -> None:
        self.replicas = replicas
        self.servers = [
            RedisServer(
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    # The bus port defaults to port + 10000, which may be taken or too large.
                    "--cluster-port", FREE_PORT,
                ]
            )
            for _ in range(size * (1 + replicas))
        ]  # fmt: skip

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def client(self, prefix: str) -> redmutex.Client:
        """A redmutex client of this cluster (the cluster tests' settings)."""
        return redmutex.Client(
            cluster=self.urls, prefix=prefix, connect_timeout=2.0, command_timeout=5.0
        )

    def start(self) -> Self:
        try:
            for server in self.servers:
                server.start()
            addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
            subprocess.run(
                [
                    redis_cli(), "--cluster", "create", *addresses,
                    "--cluster-replicas", str(self.replicas), "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
            wait_for("the cluster to settle", self.settled, timeout=30)
            if self.replicas:
                wait_for("every replica to sync", self.replicas_synced, timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def conn(self, server: RedisServer) -> redis.Redis:
        return redis.Redis(port=server.port, socket_timeout=5)

    def alive(self) -> list[RedisServer]:
        return [s for s in self.servers if s.process is not None and s.process.poll() is None]

    def kill(self, server: RedisServer) -> None:
        """SIGKILL one node (a process this cluster started, by its PID): no shutdown, no save."""
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
        server.process = None

    def role(self, server: RedisServer) -> str:
        with self.conn(server) as r:
            return str(r.info("replication")["role"])

    def replica_of(self, master: RedisServer) -> RedisServer:
        """The replica that follows `master`."""
        for server in self.alive():
            with self.conn(server) as r:
                info = r.info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == master.port:
                    return server
        raise LookupError(master.port)

    def replicas_synced(self) -> bool:
        synced = 0
        for server in self.alive():
            with self.conn(server) as r:
                info = r.info("replication")
                if info["role"] == "slave":
                    if info.get("master_link_status") != "up":
                        return False
                    synced += 1
        return synced == len(self.servers) // 2

    def settled(self) -> bool:
        """Every live node says the cluster is ok and they all agree on who owns each slot."""
        views = []
        for server in self.alive():
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
        with self.conn(self.alive()[0]) as r:
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
            server.close()

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
    """`size` independent redis-servers, each stoppable and restartable (empty, no persistence),
    each started with `extra_args` (e.g. `["--timeout", "1"]`)."""

    def __init__(self, size: int = 5, extra_args: list[str] | None = None) -> None:
        self.extra_args = list(extra_args or [])
        self.servers = [RedisServer(extra_args=self.extra_args) for _ in range(size)]

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
        old.close()
        self.servers[index] = RedisServer(port=old.port, extra_args=self.extra_args).start()

    def conn(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.servers[index].port, socket_timeout=5)

    def stop(self) -> None:
        for server in self.servers:
            server.close()

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
    """One master, one replica and `sentinels` sentinels watching them as service `name`
    (quorum: a majority of the sentinels).

    `tls=(cert, key)`: every server and sentinel also listens on a TLS port with that
    certificate (its own CA, unless `tls_ca` names the CA that issued it), replication and the
    sentinels' links go over TLS, and `url` is a `rediss+sentinel://...#insecure` URL on the
    sentinels' TLS ports. The plain ports stay open for the tests' own checks.
    """

    def __init__(
        self,
        name: str = "mymaster",
        sentinels: int = 1,
        down_after_ms: int = 5000,
        failover_timeout_ms: int = 20000,
        tls: tuple[str, str] | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.name = name
        self.tls = tls
        # By server (its port may change when start() finds the chosen one taken).
        self.tls_ports: dict[int, int] = {}

        def server(*args: str, config_file: str | None = None) -> RedisServer:
            extra = list(args)
            tls_port = free_port()
            if tls is not None:
                cert, key = tls
                extra += [
                    "--tls-port", str(tls_port), "--tls-cert-file", cert,
                    "--tls-key-file", key, "--tls-ca-cert-file", tls_ca or cert,
                    "--tls-auth-clients", "no", "--tls-replication", "yes",
                ]  # fmt: skip
            made = RedisServer(config_file=config_file, extra_args=extra)
            self.tls_ports[id(made)] = tls_port
            return made

        self.master = server()
        self.replica = server("--replicaof", "127.0.0.1", str(self.link_port(self.master)))
        self.dir = tempfile.mkdtemp(prefix="redmutex-sentinel-")
        self.sentinels = []
        quorum = sentinels // 2 + 1
        for i in range(sentinels):
            config = os.path.join(self.dir, f"sentinel-{i}.conf")
            with open(config, "w") as f:
                f.write(
                    f"sentinel monitor {name} 127.0.0.1 {self.link_port(self.master)} {quorum}\n"
                    f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                    f"sentinel failover-timeout {name} {failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {name} 1\n"
                )
            self.sentinels.append(server("--sentinel", config_file=config))
        self.sentinel = self.sentinels[0]
        self.config = os.path.join(self.dir, "sentinel-0.conf")

    def link_port(self, server: RedisServer) -> int:
        """The port the others use to reach `server` (its TLS port on a TLS group)."""
        return self.tls_ports[id(server)] if self.tls else server.port

    def server_on(self, port: int) -> RedisServer:
        """The data server (master or replica) that others reach on `port`."""
        return next(s for s in (self.master, self.replica) if self.link_port(s) == port)

    @property
    def url(self) -> str:
        if self.tls:
            hosts = ",".join(f"127.0.0.1:{self.link_port(s)}" for s in self.sentinels)
            return f"rediss+sentinel://{hosts}/{self.name}#insecure"
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.name}"

    def start(self) -> Self:
        try:
            self.master.start()
            self.replica.start()
            wait_for("the replica to sync", self.replica_synced, timeout=30)
            for sentinel in self.sentinels:
                sentinel.start()
                self._quicken(sentinel)
            wait_for("the sentinels to see the replica", self.sentinel_sees_replica, timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _quicken(sentinel: RedisServer) -> None:
        """Sentinel's timers for a test (Redis 7's SENTINEL DEBUG; an older one keeps its own):
        INFO every 1 s instead of 10 and hello every 0.5 s instead of 2. A demoted master is
        reconfigured once it has reported the wrong role for 4 hello periods, so it follows the
        new master about 2 s after a failover instead of 10."""
        try:
            with redis.Redis(port=sentinel.port, socket_timeout=5) as s:
                s.execute_command(
                    "SENTINEL", "DEBUG", "info-period", "1000", "publish-period", "500"
                )
        except redis.ResponseError:
            pass

    def sentinel_conn(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel.port, socket_timeout=5, decode_responses=True)

    def replica_synced(self) -> bool:
        with redis.Redis(port=self.replica.port, socket_timeout=5) as r:
            return bool(r.info("replication").get("master_link_status") == "up")

    def sentinel_sees_replica(self) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, socket_timeout=5) as s:
                if not s.execute_command("SENTINEL", "REPLICAS", self.name):
                    return False
                # Each sentinel must know the others too, or no quorum can be reached.
                known = s.execute_command("SENTINEL", "SENTINELS", self.name)
                if len(known) < len(self.sentinels) - 1:
                    return False
        return True

    def master_port(self) -> int:
        """The port Sentinel names for the master (the TLS port on a TLS group)."""
        with self.sentinel_conn() as s:
            _, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            return int(port)

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master (a process this group started, by its PID)."""
        master = self.server_on(self.master_port())
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        master.process.wait(timeout=10)
        master.process = None
        return master

    def failover(self) -> None:
        """SENTINEL FAILOVER, once the sentinel has the replica's own INFO (before that it
        answers NOGOODSLAVE)."""

        def ask() -> bool:
            with self.sentinel_conn() as s:
                return bool(s.execute_command("SENTINEL", "FAILOVER", self.name))

        wait_for("the sentinel to accept a failover", ask, timeout=30)

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.master):
            server.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
