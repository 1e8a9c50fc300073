-- Shared prelude of the scripts that issue a lock's fence (prepended to them, not run alone).
-- The fencing counter is no permanent key: each fence issued sets its expiry to `ttl_ms` (the
-- client's fence_ttl), and a counter created afresh starts from the server's clock in µs, so a
-- name's fences keep increasing after its counter expired, unless the Redis host's clock steps
-- back by more than the ttl. (Calls TIME before writing: needs effects replication, Redis >= 5.)
-- (A release's grant issues its fence by the same rule, read before it publishes: lock_grant.lua.)

-- Redis >= 7.0 (which names its version to scripts): SET takes GET, also with NX, so a script
-- reads and writes a key in one call. Older servers read it first (the same outcome).
local set_get = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- Issues the next fence: max(counter + 1, server time in µs); the counter lives `ttl_ms` more.
-- The clock is read on every fence, not only when the counter is missing: a counter that a
-- failover set back (writes lost with the old master) is then overtaken by the clock at once.
-- `now_us`: the server's clock in µs as this script read it already (optional; else read here).
-- Returns the fence and its decimal text (what a grant publishes), so it is written out once.
local function next_fence(fence_key, ttl_ms, now_us)
  if not now_us then
    local t = redis.call('TIME')
    now_us = t[1] * 1000000 + t[2]
  end
  local text = string.format('%d', now_us)
  local counter
  if set_get then
    -- The clock is ahead of the counter (the usual case): writing it is the whole step.
    counter = redis.call('SET', fence_key, text, 'PX', ttl_ms, 'GET')
    counter = tonumber(counter or '0') or 0
    if counter < now_us then
      return now_us, text
    end
  else
    counter = tonumber(redis.call('GET', fence_key) or '0') or 0
    if counter < now_us then
      redis.call('SET', fence_key, text, 'PX', ttl_ms)
      return now_us, text
    end
  end
  -- The counter is ahead of the clock (more than one fence in a µs, or the clock stepped back).
  local fence = counter + 1
  text = string.format('%d', fence)
  redis.call('SET', fence_key, text, 'PX', ttl_ms)
  return fence, text
end
