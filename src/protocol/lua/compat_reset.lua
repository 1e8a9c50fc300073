-- Delete a lock whoever holds it (python-redis-lock's reset, for `redmutex.compat`), waking
-- every kind of waiter: python-redis-lock's (the signal list, if given) and redmutex's.
-- KEYS[1] lock key   KEYS[2] signal list (optional)
-- ARGV[1] wake-up channel   ARGV[2] signal list's expiry in ms
-- Reply: the number of lock keys deleted (0 or 1).
-- (Published first: see lock_release.lua.)
redis.call('PUBLISH', ARGV[1], '')
local deleted = redis.call('DEL', KEYS[1])
if KEYS[2] then
  -- (exactly one element: see compat_signal_release.lua)
  redis.call('LPUSH', KEYS[2], 1)
  redis.call('LTRIM', KEYS[2], 0, 0)
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return deleted
