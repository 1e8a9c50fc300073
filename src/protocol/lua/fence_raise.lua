-- Raise the fencing counter to at least ARGV[1] (Redlock: the fence a majority agreed on is
-- written back to every master that answered, so the next majority, which intersects this one,
-- counts from above it). Never lowers the counter; its expiry is set to ARGV[2] either way (an
-- acquisition of the name, as in fence_next.lua).
-- KEYS[1] fence counter   ARGV[1] fence   ARGV[2] fence counter's ttl in ms
-- Reply: the counter afterwards.
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local wanted = tonumber(ARGV[1])
if current < wanted then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return wanted
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return current
