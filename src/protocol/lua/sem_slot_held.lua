-- Whether ARGV[1] holds semaphore slot ARGV[2] with a live lease on one Redlock master, and, when
-- ARGV[3] is given, extend that lease (after the preludes scripts.rs puts before it). A hold counts
-- a master only for the slot it won: a live lease of the token on another slot here is an
-- earlier round's grant whose give-back never landed (and whose won round's vote never arrived
-- here); counted by token it would pass for part of the hold while the slot won has lapsed on a
-- majority, and renewal would keep it alive. It is neither counted nor extended: its lease runs
-- out, or a give-back or the token's next attempt drops it.
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] slots (see sem_slot_acquire.lua)
-- ARGV[1] token   ARGV[2] the slot the hold won
-- ARGV[3] (extend only) the new lease in ms, counted from now (server clock); the slots hash
--         lives at least as long
-- ARGV[4] (extend only) wake-up channel: a lease cut short publishes '' there (see
--         lock_extend.lua)
-- Reply: 1 held (and extended); 0 not: its lease ended, it never held one here, or it holds
--        another slot here.
local now = server_now_ms()
local token, slot = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[2], 't' .. token) ~= slot
    or redis.call('HGET', KEYS[2], 's' .. slot) ~= token then
  return 0
end
local lease_end = redis.call('ZSCORE', KEYS[1], token)
if not lease_end or tonumber(lease_end) <= now then
  return 0
end
if ARGV[3] then
  -- (Published first: see lock_release.lua.)
  if ARGV[4] and tonumber(lease_end) > now + tonumber(ARGV[3]) then
    redis.call('PUBLISH', ARGV[4], '')
  end
  local ms = grant_lease(KEYS[1], token, tonumber(ARGV[3]), now)
  if redis.call('PTTL', KEYS[2]) < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
  end
end
return 1
