-- Shared prelude of the lock's fair-queue scripts (after queue_prune.lua, whose clock they use;
-- not run alone). A lock's queue is two keys:
--   the waitlist: a list of waiting tokens in arrival order;
--   its places: a hash token -> '<lease ms> <place deadline ms> <inbox>', what a release grants
--     the waiter, until when (server clock) its place holds without a refresh, and where the
--     grant is told (lock_grant.lua).
-- A token is in both or in neither: every script adds, removes or deletes them together, and
-- they get the same expiry. (Two keys, not three: the deadline rides in the place's record,
-- which every join writes anyway, so a hand-off neither writes nor reads a deadlines zset.)

-- A place's record, as a join writes it and the others read it (the one place of its format).
local function place_record(lease_ms, deadline_ms, inbox)
  return lease_ms .. ' ' .. string.format('%d', deadline_ms) .. ' ' .. inbox
end

local function parse_place(record)
  local lease, deadline, inbox = string.match(record, '^(%d+) (%d+) ?(%x*)$')
  return tonumber(lease), tonumber(deadline), inbox
end

-- A place's record: lease ms, deadline ms, inbox; nil when the token has none.
local function place_of(places_key, token)
  local record = redis.call('HGET', places_key, token)
  if not record then
    return nil
  end
  return parse_place(record)
end

-- The first token of the waitlist whose place is live at `now`, with its record; the lapsed
-- places before it are dropped. nil when no live place is left. `head`: the first token as the
-- caller read it already (optional). Places that lapsed behind a live head are left: they are
-- dropped before they could come first, or expire with the keys; a waiter that refreshes such a
-- place keeps it (nobody was served past it).
local function live_head(waitlist_key, places_key, now, head)
  head = head or redis.call('LINDEX', waitlist_key, 0)
  while head do
    local lease, deadline, inbox = place_of(places_key, head)
    if deadline and deadline > now then
      return head, lease, deadline, inbox
    end
    redis.call('LPOP', waitlist_key)
    redis.call('HDEL', places_key, head)
    head = redis.call('LINDEX', waitlist_key, 0)
  end
  return nil
end

-- The earliest deadline of a live place (after `now`) among a waitlist's places, nil when none
-- is live (read only: a MultiLock's look at whether a fair waiter keeps a place).
local function first_live_lapse(places_key, now)
  local first
  for _, record in ipairs(redis.call('HVALS', places_key)) do
    local _, deadline = parse_place(record)
    if deadline and deadline > now and (not first or deadline < first) then
      first = deadline
    end
  end
  return first
end
