-- Shared prelude of the scripts that free a semaphore's permits (after queue_prune.lua,
-- leases.lua and leases_prune.lua; not run alone): who is woken, and when the live limit goes.

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
