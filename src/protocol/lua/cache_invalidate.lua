-- Drop a cache entry: its value, and the claim of any fill in progress, whose value could predate
-- this drop and will not be stored; that fill's waiters are woken and one of them fills anew.
-- KEYS[1] value key   KEYS[2] fill claim   ARGV[1] wake-up channel
-- Reply: 1 a value was dropped; 0 there was none.
local dropped = redis.call('DEL', KEYS[1])
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[1], '')
end
return dropped
