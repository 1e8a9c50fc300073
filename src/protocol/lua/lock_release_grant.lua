-- The rest of lock_release.lua when the name has a fair queue (after the grant preludes):
-- the queue's first live waiter is granted the lock; with none left, a wake-up for all.
local now, now_us = server_clock()
if not grant_head(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2], tonumber(ARGV[3]), now,
                  ARGV[4], now_us) then
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
