-- Release a read lock if ARGV[1] holds one (appended to queue_prune.lua and leases.lua).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] waiting writers (zset)
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 released; 0 not ours (its lease had ended, or it never held one).
-- When the last live reader leaves, each waiting writer is woken by name.
local now = server_now_ms()
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if prune_leases(KEYS[1], now) == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
  for _, writer in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('PUBLISH', ARGV[2], writer)
  end
end
if tonumber(lease_end) <= now then
  return 0
end
return 1
