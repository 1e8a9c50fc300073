-- Give back a permit if ARGV[1] holds one, and wake the waiters it lets in (after the preludes
-- scripts.rs puts before it).
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] queue   KEYS[3] place deadlines
-- KEYS[4] the live limit (see sem_acquire.lua): dropped with the last holder and waiter
-- ARGV[1] token   ARGV[2] limit   ARGV[3] wake-up channel
-- Reply: 1 released; 0 not ours (its lease had ended, or it never held a permit).
-- The wake-up messages name the waiters at the head of the fair queue that the free permits let
-- in, or are '' (wake all) when nobody is queued.
local now = server_now_ms()
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(lease_end) <= now then
  -- It stopped counting when its lease ended; waiters were told to look again by then.
  drop_unused_limit(KEYS[4], KEYS[1], KEYS[2], now)
  return 0
end
wake_semaphore(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[2]), ARGV[3], now, true)
drop_unused_limit(KEYS[4], KEYS[1], KEYS[2], now)
return 1
