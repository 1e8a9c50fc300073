-- The rest of lock_release.lua when the name has a queue (after the grant preludes): the queue's
-- first live waiter is granted the lock; with none left, a wake-up for all. The lock key is
-- still ours here: a grant writes over it (one DEL less per hand-off), anything else deletes it.
local now, now_us = server_clock()
if not grant_head(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3] + 0, now, ARGV[4], now_us,
                  queued) then
  redis.call('PUBLISH', ARGV[2], '')
  redis.call('DEL', KEYS[1])
end
if KEYS[4] then
  redis.call('DEL', KEYS[4])
end
return 1
