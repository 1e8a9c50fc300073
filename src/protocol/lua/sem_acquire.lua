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
--        lapse of a waiter's place, or this waiter's own lease if that comes sooner (see below);
--        {2, live} refused, nothing written: a holder or waiter (fair or unfair: a live place in
--        KEYS[3]) of another limit (`live`) remains. A new limit takes effect once none does.
-- No command touches a key after this script may have deleted it (a key goes with its last
-- member; while its slot migrates, Redis Cluster refuses a script's command on a key the script
-- deleted, after the commands before it ran): the holders are counted, not pruned, until this
-- token's own lease is in; what the queue's pruning and this token's leaving empty is known from
-- counts (see queue_prune.lua).
local now = server_now_ms()
local token = ARGV[1]
local held = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
if held > 0 then
  local own = redis.call('ZSCORE', KEYS[1], token)
  if own and tonumber(own) > now then
    return held
  end
end

-- What is left of the queue's list and places once a pruning dropped lapsed ones (nil: not
-- known, the keys untouched; 0: gone).
local queue_left, places_left
local live = redis.call('GET', KEYS[4])
if live and live ~= ARGV[3] then
  local lapsed
  lapsed, queue_left, places_left = prune_queue(KEYS[2], KEYS[3], now)
  local placed
  if lapsed > 0 then
    placed = places_left > 0
  else
    placed = redis.call('EXISTS', KEYS[3]) == 1
  end
  if held > 0 or placed then
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
    local first = {}
    if queue_left ~= 0 then
      first = redis.call('LRANGE', KEYS[2], 0, int(free - 1))
    end
    if #first > 0 and places_left ~= 0 then
      local lapsed, q, p = prune_queue(KEYS[2], KEYS[3], now, queue_left)
      if lapsed > 0 then
        queue_left, places_left = q, p
        first = {}
        if q > 0 then
          first = redis.call('LRANGE', KEYS[2], 0, int(free - 1))
        end
      end
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
    -- The only live lease: the key lives exactly as long (what grant_lease would find out).
    -- Ended ones go once it is in (the key never empties on the way).
    redis.call('ZADD', KEYS[1], int(now + lease), token)
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  else
    holders_ms = grant_lease(KEYS[1], token, lease, now, true)
  end
  -- The limit must outlive the places left. This token's place goes (a token admitted while not
  -- among the first `free` places has none: the queue was shorter); the places are counted
  -- before, as the keys go with the last one. With nobody queued, the place deadlines are gone
  -- too (each place is in both keys).
  local places_ms = -2
  if placed or (mode == '3' and places_left ~= 0) then
    local left = redis.call('ZCARD', KEYS[3])
    left = left - redis.call('ZREM', KEYS[3], token)
    if placed then
      redis.call('LREM', KEYS[2], 1, token)
    end
    if left > 0 then
      places_ms = redis.call('PTTL', KEYS[3])
    end
  elseif queued ~= false and places_left ~= 0 then
    places_ms = redis.call('PTTL', KEYS[3])
  end
  keep_limit(math.max(holders_ms, places_ms))
  return held + 1
end

if mode == '2' or mode == '3' then
  -- (Not admitted: nothing emptied the queue's keys. A pruning that empties them lets this
  -- token in, as nobody queues before it then.)
  local place = tonumber(ARGV[5])
  if redis.call('ZADD', KEYS[3], int(now + place), token) == 1 and mode == '2' then
    redis.call('RPUSH', KEYS[2], token)
  end
  -- Every live place ends within `place` ms from now, so the queue keys may too.
  redis.call('PEXPIRE', KEYS[2], place)
  redis.call('PEXPIRE', KEYS[3], place)
  -- (Ended leases still in the holders' key are not counted: with no live holder, no lease.)
  local holders_ms = -2
  if held > 0 then
    holders_ms = redis.call('PTTL', KEYS[1])
  end
  keep_limit(math.max(holders_ms, place))
end

if free > 0 then
  -- An earlier waiter is about to take the free permit, with a lease that may run out unreleased
  -- too; nobody would say so (a release wakes the waiters it lets in by name; a lease that runs
  -- out tells nobody), so this one looks again when such a lease would end, taking its own as
  -- the measure, unless the earlier place lapses first.
  local lapse, lease = soonest_end(KEYS[3], now), tonumber(ARGV[2])
  if lapse < 0 or lapse > lease then
    lapse = lease
  end
  return {0, lapse}
end
return {0, soonest_end(KEYS[1], now)}
