-- Release the names of a MultiLock that ARGV[1] still holds, and hand each on (after
-- queue_prune.lua, fence_next.lua, waitlist.lua and lock_grant.lua), exactly as lock_release.lua
-- does for one.
-- KEYS: four per name i (1-based): KEYS[4i-3] lock key   KEYS[4i-2] fence counter
--       KEYS[4i-1] waitlist   KEYS[4i] its places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] grant slack in ms (see lock_grant.lua)
-- ARGV[3] fence counter's ttl in ms (see fence_next.lua)   ARGV[3 + i] wake-up channel of name i
-- Reply: how many of the names ARGV[1] held and released (fewer than the names: the others'
-- leases ended, and they were left alone). A released name with live waiters in its fair queue
-- is granted to the first; otherwise '' is published on its channel (wakes all its waiters).
local n = #KEYS / 4
local released = 0
local now, now_us = nil, nil
for i = 1, n do
  local k = 4 * (i - 1)
  if redis.call('GET', KEYS[k + 1]) == ARGV[1] then
    released = released + 1
    local granted = false
    -- The queue's first two tokens: the head, and whether another waits behind it (a grant
    -- to the only waiter deletes the queue's keys in one command, as lock_release.lua's does).
    local queued = redis.call('LRANGE', KEYS[k + 3], 0, 1)
    local head = queued[1]
    if head then
      if not now then
        now, now_us = server_clock()
      end
      -- (a grant writes over the lock key, still ours: see lock_release_grant.lua)
      granted = grant_head(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[3 + i],
                           tonumber(ARGV[2]), now, ARGV[3], now_us, head, #queued == 1)
    end
    if not granted then
      redis.call('DEL', KEYS[k + 1])
      redis.call('PUBLISH', ARGV[3 + i], '')
    end
  end
end
return released
