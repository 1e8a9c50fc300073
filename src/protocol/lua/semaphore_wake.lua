-- Shared prelude of the scripts that free a semaphore's permits (after queue_prune.lua and
-- leases.lua; not run alone): who is woken, and when the live limit goes.

-- Wakes the semaphore waiters that `free` permits let in: the first `free` tokens of the fair
-- queue by name, or, when nobody is queued and `or_all` is set, everybody (''). Returns whether
-- any waiter still keeps a place (a fair one's is in `queue` and `deadlines`, an unfair one's in
-- `deadlines` only); nil when no permit is free (the places are not read then).
-- `placed`, `queued`: whether `deadlines` keeps a place and how many tokens `queue` holds, when
-- the caller knows (nil: looked up here). A key the caller emptied is gone, and must not be
-- touched again (see queue_prune.lua): a caller that may have emptied one passes what it knows.
local function wake_semaphore(queue, deadlines, free, channel, now, or_all, placed, queued)
  if free < 1 then
    return nil
  end
  if placed == nil then
    placed = redis.call('EXISTS', deadlines) == 1
  end
  if placed then
    local lapsed, places
    lapsed, queued, places = prune_queue(queue, deadlines, now, queued)
    local first = {}
    if queued ~= 0 then
      first = redis.call('LRANGE', queue, 0, int(free - 1))
    end
    for _, token in ipairs(first) do
      redis.call('PUBLISH', channel, token)
    end
    if #first > 0 then
      return true
    end
    if lapsed > 0 then
      placed = places > 0
    end
  end
  if or_all then
    redis.call('PUBLISH', channel, '')
  end
  return placed
end

-- A semaphore's live limit goes with its last holder and waiter (otherwise it expires with them).
-- `held`: the live holders; `placed`: whether any waiter keeps a place in `deadlines` (nil: not
-- known, read here; only by a caller that has not emptied `deadlines`).
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
