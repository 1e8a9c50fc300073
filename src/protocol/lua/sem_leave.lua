-- A semaphore waiter gives up: leave the queue (fair) or its place (unfair) at once (after the
-- preludes scripts.rs puts before it).
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] place deadlines
-- KEYS[4] the live limit (see sem_acquire.lua): dropped with the last holder and waiter
-- ARGV[1] token   ARGV[2] limit   ARGV[3] wake-up channel
-- Reply: 1 if the token was queued, else 0. The waiters that free permits let in now are woken by
-- name, since they may have been waiting behind the one that left.
-- The keys' sizes are read before the token leaves them: a key goes with its last member, and a
-- script must not touch a key it deleted (see queue_prune.lua).
-- (Unlike a release, it leaves before its wake-ups, which name the waiters without it: a leave
-- runs only as a wait ends unheld, in its clean-up, whose error reaches no caller; refused the
-- PUBLISH, the waiter is out of the queue all the same.)
local queued, removed = redis.call('LLEN', KEYS[2]), 0
if queued > 0 then
  removed = redis.call('LREM', KEYS[2], 1, ARGV[1])
  queued = queued - removed
end
local places, unplaced = redis.call('ZCARD', KEYS[3]), 0
if places > 0 then
  unplaced = redis.call('ZREM', KEYS[3], ARGV[1])
  places = places - unplaced
end
if removed > 0 or unplaced > 0 then
  -- (Live holders counted, not dropped: the acquires and releases drop ended leases.)
  local now = server_now_ms()
  local held = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
  local placed = places > 0
  if removed > 0 then
    local still = wake_semaphore(KEYS[2], KEYS[3], tonumber(ARGV[2]) - held, ARGV[3], now, false,
                                 placed, queued)
    if still ~= nil then
      placed = still
    end
  end
  -- (An unfair waiter: nobody waits behind it, but the limit may go with it.)
  drop_unused_limit(KEYS[4], held, KEYS[3], placed)
end
return removed
