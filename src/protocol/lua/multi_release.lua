-- Release the names of a MultiLock that ARGV[1] still holds, and hand each on (after
-- clock.lua, waitlist.lua, waitlist_head.lua and lock_grant.lua), exactly as lock_release.lua
-- does for one.
-- KEYS: three per name i (1-based): KEYS[3i-2] lock key   KEYS[3i-1] fence counter
--       KEYS[3i] the name's queue places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] grant slack in ms (see lock_grant.lua)
-- ARGV[3] fence counter's ttl in ms (see fence_next.lua)   ARGV[3 + i] wake-up channel of name i
-- Reply: how many of the names ARGV[1] held and released (fewer than the names: the others'
-- leases ended, and they were left alone). A released name with live waiters in its fair queue
-- is granted to the first; otherwise '' is published on its channel (wakes all its waiters).
-- Every name's wake-up (or grant) is published before any name is written (see
-- lock_release.lua): a refused one ends the script with all of them still held.
local n = #KEYS / 3
local released = 0
local now, now_us = nil, nil
local writes = {}
for i = 1, n do
  local k = 3 * (i - 1)
  if redis.call('GET', KEYS[k + 1]) == ARGV[1] then
    released = released + 1
    local granted = false
    local queued = redis.call('HGETALL', KEYS[k + 3])
    if #queued > 0 then
      if not now then
        now, now_us = server_clock()
      end
      -- (a grant writes over the lock key, still ours: see lock_release_grant.lua)
      granted = grant_head(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[3 + i], ARGV[2] + 0, now,
                           ARGV[3], now_us, queued, writes)
    end
    if not granted then
      redis.call('PUBLISH', ARGV[3 + i], '')
      writes[#writes + 1] = {'DEL', KEYS[k + 1]}
    end
  end
end
for _, command in ipairs(writes) do
  redis.call(unpack(command))
end
return released
