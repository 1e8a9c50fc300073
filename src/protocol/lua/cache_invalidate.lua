-- Drop a cache entry: its value, and the claim of any fill in progress, whose value could predate
-- this drop and will not be stored; that fill's waiters are woken and one of them fills anew.
-- KEYS[1] value key   KEYS[2] fill claim   ARGV[1] wake-up channel
-- Reply: 1 a value was dropped; 0 there was none.
-- (Published first: see lock_release.lua. Without a fill, the common case, as many commands.)
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[1], '')
  redis.call('DEL', KEYS[2])
end
return redis.call('DEL', KEYS[1])
