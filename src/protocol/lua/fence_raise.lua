-- Raise the fencing counter to at least ARGV[1] (Redlock: the fence a majority agreed on is
-- written back to every master that granted, so the next majority, which intersects this one,
-- counts from above it). Never lowers the counter.
-- KEYS[1] fence counter   ARGV[1] fence
-- Reply: the counter afterwards.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
  redis.call('SET', KEYS[1], ARGV[1])
  return wanted
end
return current
