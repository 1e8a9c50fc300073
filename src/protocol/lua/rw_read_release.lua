-- Release a read lock if ARGV[1] holds one (after the preludes scripts.rs puts before it).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] waiting writers (zset)
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 released; 0 not ours (its lease had ended, or it never held one).
-- When the last live reader leaves, each waiting writer is woken by name.
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end then
  return 0
end
local now = server_now_ms()
-- Nobody waits to write (the common case): nothing to wake, and no range to read.
local woken = {}
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- Lapsed leases and places are skipped, not dropped (acquires and leaving writers drop them;
  -- the keys expire with their last entry).
  woken = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. int(now), '+inf')
  -- The other live readers are counted before this lease goes: the key goes with its last lease,
  -- and while its slot migrates Redis Cluster refuses a script's command on a key the script
  -- deleted (after the commands before it ran).
  if #woken > 0 then
    local others = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
    if tonumber(lease_end) > now then
      others = others - 1
    end
    if others > 0 then
      woken = {}
    end
  end
end
-- (Published first: see lock_release.lua.)
for _, writer in ipairs(woken) do
  redis.call('PUBLISH', ARGV[2], writer)
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(lease_end) <= now then
  return 0
end
return 1
