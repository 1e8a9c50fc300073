-- Shared prelude of the scripts that keep leases in a zset (token -> lease end in ms, server clock):
-- semaphore holders and read-write lock readers. Appended to clock.lua (for server_clock) and
-- queue_prune.lua (for prune_queue) and prepended to each of those scripts, not run alone. A
-- lease counts while its end lies after the server's `now`; no client clock is ever used.

-- The server's clock in ms (server_clock's first reading).
local function server_now_ms()
  return (server_clock())
end

-- An integer as the decimal string Redis expects (Lua would print a large number with an exponent).
local function int(x)
  return string.format('%d', x)
end

-- Drops the leases that ended; returns how many live ones remain.
local function prune_leases(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  return redis.call('ZCARD', key)
end

-- The key lives exactly as long as its longest lease, so a holder that dies leaves nothing behind.
local function expire_with_leases(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIRE', key, int(math.max(tonumber(last[2]) - now, 1)))
  end
end

-- Gives `token` a lease ending `lease_ms` from now (a new one, or a new end for its own).
local function grant_lease(key, token, lease_ms, now)
  redis.call('ZADD', key, int(now + lease_ms), token)
  expire_with_leases(key, now)
end

-- Ms until the soonest entry of a zset of deadlines ends (at least 1), or -1 when it is empty.
local function soonest_end(key, now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 2 then
    return math.max(tonumber(first[2]) - now, 1)
  end
  return -1
end

-- Wakes the semaphore waiters that the free permits let in: the first `free` tokens of the fair
-- queue by name, or, when nobody is queued and `or_all` is set, everybody ('').
local function wake_semaphore(holders, queue, deadlines, limit, channel, now, or_all)
  local free = limit - prune_leases(holders, now)
  if free < 1 then
    return
  end
  if redis.call('EXISTS', queue) == 1 then
    prune_queue(queue, deadlines, now)
    local first = redis.call('LRANGE', queue, 0, int(free - 1))
    for _, token in ipairs(first) do
      redis.call('PUBLISH', channel, token)
    end
    if #first > 0 then
      return
    end
  end
  if or_all then
    redis.call('PUBLISH', channel, '')
  end
end

-- A semaphore's live limit goes with its last holder and waiter (otherwise it expires with them).
local function drop_unused_limit(limit_key, holders, queue, now)
  if limit_key and prune_leases(holders, now) == 0 and redis.call('EXISTS', queue) == 0 then
    redis.call('DEL', limit_key)
  end
end
