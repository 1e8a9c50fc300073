-- Take a read lock of a read-write lock (after the preludes scripts.rs puts before it).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] writer (string: token, PX lease)
-- KEYS[3] waiting writers (zset token -> place deadline, server ms)
-- ARGV[1] token   ARGV[2] lease in ms
-- ARGV[3] '1': the caller already holds a read lock of this read-write lock, so waiting writers do
--         not hold it back (they wait for that read lock: holding back would deadlock); else '0'
-- Reply: readers (an integer) granted (also for a retry that finds its own live lease); readers =
--        live readers now, this one included (a bare integer: a table costs Redis more to convert);
--        {0, ms} not granted; ms = when to look again at the latest: the writer's lease end (-1: it
--        has no lease), or, when a waiting writer holds new readers back, the soonest lapse of a
--        waiting writer's place.
-- A retry that finds its own live lease and no waiting writer is granted like a first send (its
-- lease then ends `ARGV[2]` from now).

-- Redis >= 7.0 (which names its version to scripts) takes NX and GT on PEXPIRE: the key's expiry
-- follows its longest lease without reading the leases back.
local expire_options = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

local now = server_now_ms()
-- Nobody writes nor waits to write (the common case): one look at both keys.
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then
  -- A writer holds it: no read lease can be live (a writer gets in only when none is).
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
      -- A retry of ours granted before that writer started waiting keeps its read lock.
      local own = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
      if own and own > now then
        -- Its lease from now, as for any grant (it may be a lost Redlock round's, ending
        -- before the lease this attempt's caller counts on).
        grant_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
        return redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
      end
      return {0, math.max(tonumber(first[2]) - now, 1)}
    end
  end
end
if expire_options then
  redis.call('ZADD', KEYS[1], int(now + tonumber(ARGV[2])), ARGV[1])
  -- A key without expiry was created just now (every lease's key has one): the only lease.
  if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'NX') == 1 then
    return 1
  end
  -- Other leases keep the key: drop the lapsed ones; the key lives as long as the longest.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  return redis.call('ZCARD', KEYS[1])
end
-- (Live leases counted, and the ended ones dropped only once this lease is in, so the key never
-- empties on the way: a script must not touch a key it deleted, see leases_prune.lua.)
local readers = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
if readers == 0 then
  -- The only live lease: the key lives exactly as long (what grant_lease would find out).
  redis.call('ZADD', KEYS[1], int(now + tonumber(ARGV[2])), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local own = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
grant_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now, true)
if own and own > now then
  return readers
end
return readers + 1
