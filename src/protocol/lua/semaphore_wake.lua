-- Shared prelude of the scripts that free a semaphore's permits (after queue_prune.lua and
-- leases.lua; not run alone): who is woken, and when the live limit goes.

-- Wakes the semaphore waiters that `free` permits let in: the first `free` tokens of the fair
-- queue by name, or, when nobody is queued and `or_all` is set, everybody (''). Returns whether
-- any waiter still keeps a place (a fair one's is in `queue` and `deadlines`, an unfair one's in
-- `deadlines` only); nil when no permit is free (the places are not read then).
local function wake_semaphore(queue, deadlines, free, channel, now, or_all)
  if free < 1 then
    return nil
  end
  local placed = redis.call('EXISTS', deadlines) == 1
  if placed then
    prune_queue(queue, deadlines, now)
    local first = redis.call('LRANGE', queue, 0, int(free - 1))
    for _, token in ipairs(first) do
      redis.call('PUBLISH', channel, token)
    end
    if #first > 0 then
      return true
    end
    placed = redis.call('EXISTS', deadlines) == 1
  end
  if or_all then
    redis.call('PUBLISH', channel, '')
  end
  return placed
end

-- A semaphore's live limit goes with its last holder and waiter (otherwise it expires with them).
-- `held`: the live holders; `placed`: whether any waiter keeps a place in `deadlines` (nil: not
-- known, read here).
local function drop_unused_limit(limit_key, held, deadlines, placed)
  if not limit_key or held > 0 then
    return
  end
  if placed == nil then
    placed = redis.call('EXISTS', deadlines) == 1
  end
  if not placed then
    redis.call('DEL', limit_key)
  end
end
