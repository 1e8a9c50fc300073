"""The public type aliases of redmutex: what every `client` argument accepts.

`ClientLike` is exported as `redmutex.ClientLike` so that editors show one readable name in
hovers (instead of a private alias) and user code can annotate its own helpers with it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

from ._core import Client

__all__ = ["ClientLike", "RedisLike"]


class RedisLike(Protocol):
    """A redis-py client (`redis.Redis`): its connection pool's settings are reused.

    A Protocol rather than `redis.Redis` itself, because redis-py is an optional dependency
    (`pip install redmutex[redis]`): without it installed, `redis.Redis` would be `Any` to a
    type checker and every `client` argument would accept anything.
    """

    @property
    def connection_pool(self) -> Any: ...


ClientLike: TypeAlias = Client | str | RedisLike
"""What every `client` argument accepts: a `redmutex.Client`, a URL string
(`redis://host:6379/0`, `rediss://`, `unix://`, a Redlock list, ...), or a redis-py client."""
