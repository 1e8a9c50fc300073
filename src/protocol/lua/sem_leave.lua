-- A semaphore waiter gives up: leave the queue (fair) or its place (unfair) at once (after the
-- preludes scripts.rs puts before it).
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] place deadlines
-- KEYS[4] the live limit (see sem_acquire.lua): dropped with the last holder and waiter
-- ARGV[1] token   ARGV[2] limit   ARGV[3] wake-up channel
-- Reply: 1 if the token was queued, else 0. The waiters that free permits let in now are woken by
-- name, since they may have been waiting behind the one that left.
local removed = redis.call('LREM', KEYS[2], 1, ARGV[1])
local unplaced = redis.call('ZREM', KEYS[3], ARGV[1])
if removed > 0 then
  local now = server_now_ms()
  local held = prune_leases(KEYS[1], now)
  local queued = wake_semaphore(KEYS[2], KEYS[3], tonumber(ARGV[2]) - held, ARGV[3], now, false)
  drop_unused_limit(KEYS[4], held, KEYS[3], queued)
elseif unplaced > 0 then
  -- An unfair waiter: nobody waits behind it, but the limit may go with it.
  drop_unused_limit(KEYS[4], prune_leases(KEYS[1], server_now_ms()), KEYS[3])
end
return removed
