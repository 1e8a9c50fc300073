-- Take a read lock of a read-write lock (appended to queue_prune.lua and leases.lua).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] writer (string: token, PX lease)
-- KEYS[3] waiting writers (zset token -> place deadline, server ms)
-- ARGV[1] token   ARGV[2] lease in ms
-- ARGV[3] '1': the caller already holds a read lock of this read-write lock, so waiting writers do
--         not hold it back (they wait for that read lock: holding back would deadlock); else '0'
-- Reply: {1, readers} granted (also for a retry that finds its own live lease); readers = live
--        readers now, this one included;
--        {0, ms} not granted; ms = when to look again at the latest: the writer's lease end (-1: it
--        has no lease), or, when a waiting writer holds new readers back, the soonest lapse of a
--        waiting writer's place.
local now = server_now_ms()
local own = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if own and own > now then
  return {1, redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')}
end
local writer_ttl = redis.call('PTTL', KEYS[2])
if writer_ttl ~= -2 then
  return {0, writer_ttl}
end
if ARGV[3] ~= '1' then
  -- Writer preference: while a writer waits, no new reader gets in, so readers arriving
  -- continuously cannot starve it. (Lapsed places are skipped, not dropped: a leaving writer
  -- drops them, and the key expires with its last place.)
  local first = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. int(now), '+inf', 'WITHSCORES',
                           'LIMIT', 0, 1)
  if #first == 2 then
    return {0, math.max(tonumber(first[2]) - now, 1)}
  end
end
local readers = prune_leases(KEYS[1], now)
if readers == 0 then
  -- The only lease: the key lives exactly as long (what grant_lease would find out).
  redis.call('ZADD', KEYS[1], int(now + tonumber(ARGV[2])), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  grant_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
end
return {1, readers + 1}
