-- Shared prelude (after leases.lua; not run alone): drop a zset's ended leases.

-- Drops the leases that ended; returns how many live ones remain. The key goes with its last
-- lease, so 0 means it is gone (or was never there): the caller must not touch it again in this
-- script (while its slot migrates, Redis Cluster refuses a script's command on a key the script
-- deleted, after the commands before it ran). Hence the count is read first, not after.
local function prune_leases(key, now)
  local leases = redis.call('ZCARD', key)
  if leases == 0 then
    return 0
  end
  return leases - redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
end
