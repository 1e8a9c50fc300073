-- Extend a lease kept in a zset if ARGV[1] holds a live one: compare-and-extend (after the
-- preludes scripts.rs puts before it). Used for semaphore holders and read-write lock
-- readers.
-- KEYS[1] leases (zset token -> lease end, server ms)   ARGV[1] token
-- KEYS[2] (semaphores only) the live limit: its expiry is stretched to the leases' if shorter
-- ARGV[2] new lease in ms, counted from now (server clock)
-- ARGV[3] wake-up channel (optional): a lease cut short publishes '' there (see lock_extend.lua)
-- Reply: 1 extended; 0 not ours (its lease had ended, or it never held one).
local now = server_now_ms()
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end then
  return 0
end
if tonumber(lease_end) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
-- (Published first: see lock_release.lua.)
if ARGV[3] and tonumber(lease_end) > now + tonumber(ARGV[2]) then
  redis.call('PUBLISH', ARGV[3], '')
end
local ms = grant_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
if KEYS[2] then
  local left = redis.call('PTTL', KEYS[2])
  if left ~= -2 and left < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
  end
end
return 1
