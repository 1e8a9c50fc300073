-- Shared prelude of the queues kept as a list plus a deadlines zset (the semaphore's, the
-- read-write lock's writers'; after clock.lua, prepended to their scripts, not run alone): drops
-- waiters whose place lapsed (they stopped refreshing it: died or left), using the server's clock
-- so client clocks never matter. `queue_key`: list of tokens in arrival order; `deadline_key`:
-- zset token -> place deadline in ms. Returns how many places lapsed.
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
