-- The rest of lock_release.lua when the name has a fair queue (after the grant preludes):
-- the queue's first live waiter is granted the lock; with none left, a wake-up for all.
if not grant_head(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2], tonumber(ARGV[3]),
                  server_now_ms(), ARGV[4]) then
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
