-- Shared prelude (after leases.lua; not run alone): when the soonest live deadline of a zset ends.

-- Ms until the soonest entry of a zset of deadlines that ends after `now` ends (at least 1), or
-- -1 when none does. Ended entries are skipped, not dropped (the scripts that drop them do it
-- before they could delete the key and still touch it; see leases_prune.lua).
local function soonest_end(key, now)
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT',
                           0, 1)
  if #first == 2 then
    return math.max(tonumber(first[2]) - now, 1)
  end
  return -1
end
