"""Drop-in replacements for other Redis lock libraries, running on redmutex's engine.

- `redmutex.compat.redis_py`: redis-py's `redis.lock.Lock` and `Redis.lock` (and
  `redmutex.compat.redis_py.asyncio` for `redis.asyncio`).
- `redmutex.compat.redis_lock`: python-redis-lock's `redis_lock.Lock`, `reset_all` and its
  exceptions.

Both use the original library's keys and values, so processes still on the original and
processes on the shim exclude each other while a fleet migrates. See docs/compat.md.
"""
