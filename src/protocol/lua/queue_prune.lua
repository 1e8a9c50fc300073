-- Shared prelude of the queues kept as a list plus a deadlines zset (the semaphore's, the
-- read-write lock's writers'; after clock.lua, prepended to their scripts, not run alone): drops
-- waiters whose place lapsed (they stopped refreshing it: died or left), using the server's clock
-- so client clocks never matter. `queue_key`: list of tokens in arrival order; `deadline_key`:
-- zset token -> place deadline in ms. `queued`: the list's length if the caller knows it (nil:
-- read here, when a place lapsed).
-- Returns how many places lapsed, then (when any did) how many tokens the list and how many
-- places the zset keep. A key goes with its last member, and while its slot migrates Redis
-- Cluster refuses a script's command on a key the script deleted (after the commands before it
-- ran): the counts are read before anything goes, so that neither this function nor its caller
-- touches a key that is gone (0 left).
local function prune_queue(queue_key, deadline_key, now, queued)
  local lapsed = redis.call('ZRANGEBYSCORE', deadline_key, '-inf', now)
  if #lapsed == 0 then
    return 0, queued
  end
  local places = redis.call('ZCARD', deadline_key) - #lapsed
  queued = queued or redis.call('LLEN', queue_key)
  for _, token in ipairs(lapsed) do
    if queued == 0 then
      break
    end
    queued = queued - redis.call('LREM', queue_key, 1, token)
  end
  redis.call('ZREMRANGEBYSCORE', deadline_key, '-inf', now)
  return #lapsed, queued, places
end
