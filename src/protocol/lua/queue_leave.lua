-- A waiter gives up: leave the queue at once (after clock.lua, fence_next.lua, waitlist.lua and
-- lock_grant.lua).
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] the queue's places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] wake-up channel   ARGV[3] grant slack in ms (see lock_grant.lua)
-- ARGV[4] fence counter's ttl in ms (see fence_next.lua)
-- Reply: 1 if the token was queued or had been granted the lock, else 0. A grant that came
-- while the waiter was giving up is given back. When the lock is free, it goes to the new head,
-- which may have been waiting behind the one that left; a grant given back with nobody queued
-- is published to all (as a release is), for the waiters that do not queue.
local removed = redis.call('HDEL', KEYS[3], ARGV[1])
local owner = redis.call('GET', KEYS[1])
local freed = owner == ARGV[1]
if freed then
  redis.call('DEL', KEYS[1])
  owner = false
  removed = 1
end
if owner == false then
  local now, now_us = server_clock()
  if not grant_head(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3] + 0, now, ARGV[4], now_us)
      and freed then
    redis.call('PUBLISH', ARGV[2], '')
  end
end
return removed
