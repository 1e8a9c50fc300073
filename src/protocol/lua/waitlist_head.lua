-- Shared prelude of the lock's scripts that serve the queue's head (after clock.lua and
-- waitlist.lua; not run alone): the acquire that lets the first live waiter take a free lock,
-- and the grants of releases and leaves.

-- The first place that is live at `now`: its token, lease, deadline and inbox; the lapsed places
-- before it are dropped. nil when no place is live. `all`: the places as HGETALL read them
-- (optional; else read here). Places that lapsed behind a live one are left: they are dropped
-- before they could come first, or expire with the key; a waiter that refreshes such a place
-- keeps it (nobody was served past it).
local function live_head(places_key, now, all)
  all = all or redis.call('HGETALL', places_key)
  local left = #all / 2
  while left > 0 do
    local first, at
    for i = 2, #all, 2 do
      local record = all[i]
      if record and (not first or record < first) then
        first, at = record, i
      end
    end
    local _, deadline, lease, inbox = parse_place(first)
    if deadline and deadline > now then
      return all[at - 1], lease, deadline, inbox
    end
    redis.call('HDEL', places_key, all[at - 1])
    all[at] = false
    left = left - 1
  end
  return nil
end
