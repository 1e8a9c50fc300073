-- Extend a lease the way redis-py's Lock.extend does (for `redmutex.compat.redis_py`): add to
-- what is left of it, or replace it.
-- KEYS[1] lock key   ARGV[1] token   ARGV[2] ms   ARGV[3] '1': the lease ends ARGV[2] ms from
-- now; anything else: ARGV[2] ms are added to what is left.
-- Reply: {1, new lease in ms} extended; {0, 0} not ours (the lease ended, or another owner
-- holds it); {-1, 0} ours but without expiry (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  return {-1, 0}
end
local ms = tonumber(ARGV[2])
if ARGV[3] ~= '1' then
  ms = ms + left
end
redis.call('PEXPIRE', KEYS[1], ms)
return {1, ms}
