-- Acquire a lock (no queue): SET NX PX and the fence INCR in one atomic step.
-- KEYS[1] lock key (string: owner token)   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] lease in ms
-- Reply: {1, fence} when ARGV[1] holds the lock now (a retry that finds its own token in place
--        counts: nobody else can have incremented the fence while we held it);
--        {0, pttl} when another owner holds it; pttl = ms left on its lease (-1: no lease).
local owner = redis.call('GET', KEYS[1])
if owner == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
end
if owner == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, redis.call('PTTL', KEYS[1])}
