-- A waiter gives up: leave the queue at once (after clock.lua, waitlist.lua, waitlist_head.lua
-- and lock_grant.lua).
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] the queue's places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] wake-up channel   ARGV[3] grant slack in ms (see lock_grant.lua)
-- ARGV[4] fence counter's ttl in ms (see fence_next.lua)
-- Reply: 1 if the token was queued or had been granted the lock, else 0. A grant that came
-- while the waiter was giving up is given back. When the lock is free, it goes to the new head,
-- which may have been waiting behind the one that left; a grant given back with nobody queued
-- is published to all (as a release is), for the waiters that do not queue.
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then
  -- Another holds the lock (the common leave): only the place goes.
  return redis.call('HDEL', KEYS[3], ARGV[1])
end
-- The lock is free, or was granted to this waiter (given back here). The places are read first,
-- this one's goes last (after what is published: see lock_release.lua), and a grant writes over
-- the lock key rather than after a DEL of it: a key goes with its last field (or a DEL), and
-- while its slot migrates Redis Cluster refuses a script's command on a key the script deleted
-- (after the commands before it ran).
local freed = owner == ARGV[1]
local placed = false
local all = redis.call('HGETALL', KEYS[3])
local others = {}
for i = 1, #all, 2 do
  if all[i] == ARGV[1] then
    placed = true
  else
    others[#others + 1] = all[i]
    others[#others + 1] = all[i + 1]
  end
end
local granted = false
if #others > 0 then
  local now, now_us = server_clock()
  granted = grant_head(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3] + 0, now, ARGV[4], now_us,
                       others)
end
if freed and not granted then
  redis.call('PUBLISH', ARGV[2], '')
  redis.call('DEL', KEYS[1])
end
if placed then
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return (freed or placed) and 1 or 0
