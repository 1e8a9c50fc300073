-- Give back the semaphore slot of ARGV[1] on one Redlock master, and wake the waiters (after
-- the preludes scripts.rs puts before it).
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] slots (see sem_slot_acquire.lua)
-- ARGV[1] token   ARGV[2] wake-up channel
-- ARGV[3] (the release of a hold) the slot the hold won: a lease of the token in another slot
--         (stale: see sem_slot_held.lua) goes too, but is no release of the hold
-- Reply: 1 released; 0 not ours (its lease had ended, it never held a slot here, or it held
--        another slot than ARGV[3]).
-- With the last holder gone both keys are gone: nothing is left behind.
local now = server_now_ms()
local token = ARGV[1]
local slot = redis.call('HGET', KEYS[2], 't' .. token)
local lease_end = redis.call('ZSCORE', KEYS[1], token)
-- (Published first: see lock_release.lua.)
if lease_end and tonumber(lease_end) > now then
  redis.call('PUBLISH', ARGV[2], '')
end
if slot then
  redis.call('HDEL', KEYS[2], 't' .. token)
  if redis.call('HGET', KEYS[2], 's' .. slot) == token then
    redis.call('HDEL', KEYS[2], 's' .. slot)
  end
end
if lease_end then
  redis.call('ZREM', KEYS[1], token)
end
if prune_leases(KEYS[1], now) == 0 then
  redis.call('DEL', KEYS[2])
end
if not lease_end or tonumber(lease_end) <= now then
  return 0
end
if ARGV[3] and slot ~= ARGV[3] then
  return 0
end
return 1
