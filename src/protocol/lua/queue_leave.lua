-- A fair waiter gives up: leave the queue at once (appended to queue_prune.lua).
-- KEYS[1] lock key   KEYS[2] queue   KEYS[3] place deadlines
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 if the token was queued, else 0. When the lock is free, the new head is woken,
-- since it may have been waiting behind the one that left.
local removed = redis.call('LREM', KEYS[2], 1, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  prune_queue(KEYS[2], KEYS[3], server_now_ms())
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
return removed
