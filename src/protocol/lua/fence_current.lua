-- Shared prelude of the scripts that acquire a lock (after fence_next.lua; not run alone): the
-- fence of a hold already in place. Apart from fence_next.lua because the releases, which only
-- issue fences for their grants, never call it (see clock.lua).

-- The fence of a hold already in place (a resent acquire, or a grant by a release): the
-- counter, or a new fence if the counter expired meanwhile (a hold longer than the ttl).
local function current_fence(fence_key, ttl_ms)
  local counter = tonumber(redis.call('GET', fence_key) or '')
  if counter then
    return counter
  end
  return (next_fence(fence_key, ttl_ms))
end
