-- Acquire several locks at once, all or none (after clock.lua, fence_next.lua,
-- fence_current.lua and waitlist.lua): the names of a MultiLock on one server, or one run of
-- them that shares a cluster hash slot. They are the names of `Lock` (same keys), so a MultiLock
-- and single Locks exclude each other.
-- KEYS: three per name i (1-based): KEYS[3i-2] lock key (string: owner token, as lock_acquire.lua)
--       KEYS[3i-1] fence counter   KEYS[3i] the name's queue places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] fence counter's ttl in ms (see fence_next.lua)
-- A name counts as free when nobody holds it and no live waiter keeps a place in its fair queue
-- (a MultiLock never jumps a fair queue); a name ARGV[1] holds already (a resend after a dropped
-- connection, or a name kept while waiting for the next run on a cluster) counts as its own and
-- its lease is renewed to ARGV[2] from now.
-- Reply: {1, fence_1, ..., fence_n} when ARGV[1] holds every name now (nothing was written
--        unless every name was free or its own);
--        {0, ms, i} when name i is busy and nothing was written: ms = the holder's lease left
--        (-1: no lease), or, when it is free but a fair waiter is queued, until the first
--        live place lapses.

-- The earliest deadline of a live place (after `now`) among a queue's places, nil when none is
-- live (read only: a MultiLock's look at whether a fair waiter keeps a place).
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

local n = #KEYS / 3
local owners = {}
local now = nil
for i = 1, n do
  local owner = redis.call('GET', KEYS[3 * i - 2])
  owners[i] = owner
  if owner ~= ARGV[1] then
    if owner then
      return {0, redis.call('PTTL', KEYS[3 * i - 2]), i}
    end
    now = now or (server_clock())
    local lapse = first_live_lapse(KEYS[3 * i], now)
    if lapse then
      return {0, math.max(lapse - now, 1), i}
    end
  end
end
local reply = {1}
for i = 1, n do
  if owners[i] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[3 * i - 2], ARGV[2])
    reply[i + 1] = current_fence(KEYS[3 * i - 1], ARGV[3])
  else
    redis.call('SET', KEYS[3 * i - 2], ARGV[1], 'PX', ARGV[2])
    reply[i + 1] = (next_fence(KEYS[3 * i - 1], ARGV[3]))
  end
end
return reply
