-- Shared prelude (not run alone): when the soonest deadline of a zset ends.

-- Ms until the soonest entry of a zset of deadlines ends (at least 1), or -1 when it is empty.
local function soonest_end(key, now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 2 then
    return math.max(tonumber(first[2]) - now, 1)
  end
  return -1
end
