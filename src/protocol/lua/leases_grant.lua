-- Shared prelude (after leases.lua; not run alone): grant a lease, and keep its zset exactly as
-- long as its last lease.

-- The key lives exactly as long as its longest lease, so a holder that dies leaves nothing behind.
-- Returns the key's ttl in ms as set (-2: no lease, no key).
local function expire_with_leases(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 2 then
    local ms = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', key, int(ms))
    return ms
  end
  return -2
end

-- Gives `token` a lease ending `lease_ms` from now (a new one, or a new end for its own); returns
-- the key's ttl in ms as set. `prune`: the ended leases go too, after the new one is in, so the
-- key never empties on the way (see leases_prune.lua).
local function grant_lease(key, token, lease_ms, now, prune)
  redis.call('ZADD', key, int(now + lease_ms), token)
  if prune then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  end
  return expire_with_leases(key, now)
end
