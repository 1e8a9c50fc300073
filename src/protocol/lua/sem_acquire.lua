-- Take a permit of a semaphore (after the preludes scripts.rs puts before it).
-- KEYS[1] holders (zset token -> lease end, server ms)   KEYS[2] queue (list of waiting tokens in
-- arrival order)   KEYS[3] place deadlines (zset token -> ms, server clock)
-- KEYS[4] the live limit (string), kept as long as the holders and the queue
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] limit (>= 1)
-- ARGV[4] '0': unfair, any free permit will do (the queue is ignored); '1': fair, try once without
--         queueing; '2': fair, and join (or stay in) the queue when not admitted; '3': unfair, as
--         '0', by a waiter, which keeps a place in KEYS[3] only (it takes no turn by it: the place
--         only tells that a waiter of this limit remains, see below) while not admitted
-- ARGV[5] how long a silent waiter keeps its place in the queue, in ms
-- Reply: holders (an integer) admitted (also for a retry that finds its own live permit); holders
--        = live holders now, this one included (a bare integer: a table costs Redis more to convert);
--        {0, ms} not admitted; ms = when to look again at the latest: the soonest lease end when every
--        permit is taken, or, while permits are free but earlier waiters come first, the soonest
--        lapse of a waiter's place;
--        {2, live} refused, nothing written: a holder or waiter (fair or unfair: a live place in
--        KEYS[3]) of another limit (`live`) remains. A new limit takes effect once none does.
local now = server_now_ms()
local token = ARGV[1]
local held = prune_leases(KEYS[1], now)
if held > 0 and redis.call('ZSCORE', KEYS[1], token) then
  return held
end

local live = redis.call('GET', KEYS[4])
if live and live ~= ARGV[3] then
  prune_queue(KEYS[2], KEYS[3], now)
  if held > 0 or redis.call('EXISTS', KEYS[3]) == 1 then
    return {2, tonumber(live)}
  end
end

-- The limit lives as long as the holders and the place deadlines, whichever is longer: `ms`.
local function keep_limit(ms)
  if ms > 0 then
    redis.call('SET', KEYS[4], ARGV[3], 'PX', ms)
  end
end

local free = tonumber(ARGV[3]) - held
local mode = ARGV[4]
-- queued: whether anybody queues (nil: not read); placed: whether this token does.
local admitted, queued, placed = false, nil, false
if free > 0 then
  if mode == '0' or mode == '3' then
    admitted = true
  else
    -- FIFO: the first `free` waiters may enter; anybody else only if all waiters fit before it.
    -- Lapsed places are dropped first (with nobody queued, there are none).
    local first = redis.call('LRANGE', KEYS[2], 0, int(free - 1))
    if #first > 0 and prune_queue(KEYS[2], KEYS[3], now) > 0 then
      first = redis.call('LRANGE', KEYS[2], 0, int(free - 1))
    end
    queued = #first > 0
    admitted = #first < free
    for _, waiting in ipairs(first) do
      if waiting == token then
        admitted, placed = true, true
      end
    end
  end
end

if admitted then
  local lease = tonumber(ARGV[2])
  local holders_ms = lease
  if held == 0 then
    -- The only lease: the key lives exactly as long (what grant_lease would find out).
    redis.call('ZADD', KEYS[1], int(now + lease), token)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  else
    holders_ms = grant_lease(KEYS[1], token, lease, now)
  end
  -- (A token admitted while not among the first `free` places has none: the queue was shorter.)
  if placed then
    redis.call('ZREM', KEYS[3], token)
    redis.call('LREM', KEYS[2], 1, token)
  elseif mode == '3' then
    redis.call('ZREM', KEYS[3], token)
  end
  -- With nobody queued, the place deadlines are gone too (each place is in both keys).
  if queued == false then
    keep_limit(holders_ms)
  else
    keep_limit(math.max(holders_ms, redis.call('PTTL', KEYS[3])))
  end
  return held + 1
end

if mode == '2' or mode == '3' then
  local place = tonumber(ARGV[5])
  if redis.call('ZADD', KEYS[3], int(now + place), token) == 1 and mode == '2' then
    redis.call('RPUSH', KEYS[2], token)
  end
  -- Every live place ends within `place` ms from now, so the queue keys may too.
  redis.call('PEXPIRE', KEYS[2], place)
  redis.call('PEXPIRE', KEYS[3], place)
  keep_limit(math.max(redis.call('PTTL', KEYS[1]), place))
end

if free > 0 then
  return {0, soonest_end(KEYS[3], now)}
end
return {0, soonest_end(KEYS[1], now)}
