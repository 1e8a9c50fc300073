-- Give back a permit if ARGV[1] holds one, and wake the waiters it lets in (after the preludes
-- scripts.rs puts before it).
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] queue   KEYS[3] place deadlines
-- KEYS[4] the live limit (see sem_acquire.lua): dropped with the last holder and waiter
-- ARGV[1] token   ARGV[2] limit   ARGV[3] wake-up channel
-- Reply: 1 released; 0 not ours (its lease had ended, or it never held a permit).
-- The wake-up messages name the waiters at the head of the fair queue that the free permits let
-- in, or are '' (wake all) when nobody is queued.
local now = server_now_ms()
-- Ended leases go first, so the token is still there only if it held a live permit. The holders
-- are counted before anything goes: the key goes with its last lease, and a script must not touch
-- a key it deleted (see queue_prune.lua), so `held` is worked out from the replies. The permit
-- itself goes after the wake-up (see lock_release.lua): `held` counts it out beforehand.
local held, released = redis.call('ZCARD', KEYS[1]), false
if held > 0 then
  held = held - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  if held > 0 then
    released = redis.call('ZSCORE', KEYS[1], ARGV[1])
  end
end
if not released then
  -- Not ours, or its lease had ended (waiters were told to look again by then): nobody to wake.
  drop_unused_limit(KEYS[4], held, KEYS[3])
  return 0
end
held = held - 1
local queued = wake_semaphore(KEYS[2], KEYS[3], tonumber(ARGV[2]) - held, ARGV[3], now, true)
redis.call('ZREM', KEYS[1], ARGV[1])
drop_unused_limit(KEYS[4], held, KEYS[3], queued)
return 1
