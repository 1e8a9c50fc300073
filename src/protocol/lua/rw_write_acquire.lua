-- Take the write lock of a read-write lock (after the preludes scripts.rs puts before it).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] writer (string: token, PX lease)
-- KEYS[3] waiting writers (zset token -> place deadline, server ms)
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] how long a silent waiting writer keeps its place, in ms
-- ARGV[4] '1': when not granted, wait as a writer (or stay waiting): new readers are held back
--         until the place is taken back or lapses; '0': try once
-- ARGV[5] the read-write lock's wake-up channel: a writer that takes the lock from its waiting
--         place publishes '' there (see below)
-- Reply: 0 (an integer) granted (also for a retry that finds its own token in place, whose lease
--        is then renewed to ARGV[2] from now; a grant is a
--        bare integer: a table costs Redis more to convert);
--        {0, ms} not granted; ms = when to look again at the latest: the writer's lease end (-1: it
--        has no lease), or the soonest end of a reader's lease.

-- Redis >= 7.0 (which names its version to scripts): SET takes NX with GET, so a free write lock
-- is taken, or a held one read, in one call. Older servers read it first (the same outcome).
local set_get = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

local now = server_now_ms()
-- Live readers, counted without dropping the ended ones first (read acquires drop those, and
-- the key expires with its last lease).
local readers = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
local owner
if readers == 0 and set_get then
  owner = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
else
  owner = redis.call('GET', KEYS[2])
  if owner == false and readers == 0 then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  end
end
if owner == ARGV[1] then
  -- Its lease from now: the token may be an earlier attempt's (a lost Redlock round's whose
  -- give-back never landed), ending before the lease this attempt's caller counts on.
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 0
end
if owner == false and readers == 0 then
  -- Taken: a waiting place of this writer's is given back. The readers that place held back
  -- were told to look again when it lapses (up to a place later): that this writer took the
  -- lock, whose lease may run out unreleased, they learn now. (A writer that did not wait,
  -- the common case, had no place: nobody to tell.) Published before the place goes (see
  -- lock_release.lua); refused (the user may not use the channel), the write lock taken above
  -- is given back, and the refusal is the reply.
  if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    local told = redis.pcall('PUBLISH', ARGV[5], '')
    if type(told) == 'table' and told.err then
      redis.call('DEL', KEYS[2])
      return told
    end
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  return 0
end
if ARGV[4] == '1' then
  local place = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[3], int(now + place), ARGV[1])
  -- Every live place ends within `place` ms from now, so the key may too.
  redis.call('PEXPIRE', KEYS[3], place)
end
if owner then
  return {0, redis.call('PTTL', KEYS[2])}
end
-- Readers hold it: their ended leases go, so the soonest end is a live reader's.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
return {0, soonest_end(KEYS[1], now)}
