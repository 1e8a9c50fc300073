-- Take a permit of a semaphore (after the preludes scripts.rs puts before it).
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] queue (list of waiting tokens in
-- arrival order)   KEYS[3] place deadlines (zset token -> ms, server clock)
-- KEYS[4] the live limit (string), kept as long as the holders and the queue
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] limit (>= 1)
-- ARGV[4] '0': unfair, any free permit will do (the queue is ignored); '1': fair, try once without
--         queueing; '2': fair, and join (or stay in) the queue when not admitted
-- ARGV[5] how long a silent waiter keeps its place in the queue, in ms
-- Reply: {1, holders} admitted (also for a retry that finds its own live permit); holders = live
--        holders now, this one included;
--        {0, ms} not admitted; ms = when to look again at the latest: the soonest lease end when every
--        permit is taken, or, while permits are free but earlier waiters come first, the soonest
--        lapse of a waiter's place;
--        {2, live} refused, nothing written: a holder or queued waiter of another limit (`live`)
--        remains. A new limit takes effect once none does.
local now = server_now_ms()
local token = ARGV[1]
local held = prune_leases(KEYS[1], now)
if redis.call('ZSCORE', KEYS[1], token) then
  return {1, held}
end

local live = redis.call('GET', KEYS[4])
if live and live ~= ARGV[3] then
  prune_queue(KEYS[2], KEYS[3], now)
  if held > 0 or redis.call('LLEN', KEYS[2]) > 0 then
    return {2, tonumber(live)}
  end
end

-- The limit lives as long as the holders and the place deadlines, whichever is longer.
local function keep_limit()
  local ms = math.max(redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[3]))
  if ms > 0 then
    redis.call('SET', KEYS[4], ARGV[3], 'PX', ms)
  end
end

local free = tonumber(ARGV[3]) - held
local mode = ARGV[4]
local admitted = false
if free > 0 then
  if mode == '0' then
    admitted = true
  else
    prune_queue(KEYS[2], KEYS[3], now)
    -- FIFO: the first `free` waiters may enter; anybody else only if all waiters fit before it.
    local first = redis.call('LRANGE', KEYS[2], 0, int(free - 1))
    admitted = #first < free
    for _, waiting in ipairs(first) do
      if waiting == token then
        admitted = true
      end
    end
  end
end

if admitted then
  grant_lease(KEYS[1], token, tonumber(ARGV[2]), now)
  if mode ~= '0' and redis.call('ZREM', KEYS[3], token) == 1 then
    redis.call('LREM', KEYS[2], 1, token)
  end
  keep_limit()
  return {1, held + 1}
end

if mode == '2' then
  local place = tonumber(ARGV[5])
  if redis.call('ZADD', KEYS[3], int(now + place), token) == 1 then
    redis.call('RPUSH', KEYS[2], token)
  end
  -- Every live place ends within `place` ms from now, so the queue keys may too.
  redis.call('PEXPIRE', KEYS[2], place)
  redis.call('PEXPIRE', KEYS[3], place)
  keep_limit()
end

if free > 0 then
  return {0, soonest_end(KEYS[3], now)}
end
return {0, soonest_end(KEYS[1], now)}
