-- Shared prelude (after leases.lua; not run alone): drop a zset's ended leases.

-- Drops the leases that ended; returns how many live ones remain.
local function prune_leases(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  return redis.call('ZCARD', key)
end
