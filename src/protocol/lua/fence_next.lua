-- Shared prelude of the scripts that issue a lock's fence (prepended to them, not run alone).
-- The fencing counter is no permanent key: each fence issued sets its expiry to `ttl_ms` (the
-- client's fence_ttl), and a counter created afresh starts from the server's clock in µs, so a
-- name's fences keep increasing after its counter expired, unless the Redis host's clock steps
-- back by more than the ttl. (Calls TIME before writing: needs effects replication, Redis >= 5.)

-- Issues the next fence: max(counter + 1, server time in µs); the counter lives `ttl_ms` more.
local function next_fence(fence_key, ttl_ms)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local counter = tonumber(redis.call('GET', fence_key) or '0') or 0
  local fence = math.max(counter + 1, now_us)
  redis.call('SET', fence_key, string.format('%d', fence), 'PX', ttl_ms)
  return fence
end

-- The fence of a hold already in place (a resent acquire, or a grant by a release): the
-- counter, or a new fence if the counter expired meanwhile (a hold longer than the ttl).
local function current_fence(fence_key, ttl_ms)
  local counter = tonumber(redis.call('GET', fence_key) or '')
  if counter then
    return counter
  end
  return next_fence(fence_key, ttl_ms)
end
