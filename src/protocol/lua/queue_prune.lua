-- Shared prelude of the queue scripts (prepended to them, not run alone): the server's clock,
-- for every queue (the lock's waitlist.lua uses it too), and the pruning of a queue kept as a list
-- plus a deadlines zset (the semaphore's, the read-write lock's writers'): drops waiters whose
-- place lapsed (they stopped refreshing it: died or left), using the server's clock so client
-- clocks never matter. Needs `queue_key` (list of tokens in arrival order) and `deadline_key`
-- (zset token -> place deadline in ms) to be set by the caller. Returns how many places lapsed.
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The server's clock in ms and the same reading in µs, for a script that also issues a fence
-- (next_fence in fence_next.lua takes the µs): one TIME call serves the whole script.
local function server_clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function prune_queue(queue_key, deadline_key, now)
  local lapsed = redis.call('ZRANGEBYSCORE', deadline_key, '-inf', now)
  for _, token in ipairs(lapsed) do
    redis.call('LREM', queue_key, 1, token)
  end
  if #lapsed > 0 then
    redis.call('ZREMRANGEBYSCORE', deadline_key, '-inf', now)
  end
  return #lapsed
end
