-- Release a lock if ARGV[1] owns it, and hand it on. With nobody queued it ends here (the common
-- case: the grant preludes that follow, clock.lua, waitlist.lua, waitlist_head.lua and
-- lock_grant.lua, are then not run at all); with a queue, lock_release_grant.lua goes on.
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] the queue's places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] wake-up channel   ARGV[3] grant slack in ms (see lock_grant.lua)
-- ARGV[4] fence counter's ttl in ms (see fence_next.lua)
-- KEYS[4] a re-entrant lock's hold count (optional; see lock_reenter.lua): goes with the lock,
--         also when a nested release that should have lowered it never reached Redis
-- ARGV[5..] fences (optional): the resend of a release of a token the caller chose (the recipes'
--         identifier) after its connection dropped. It releases only while the fence counter
--         reads one of them, the values the hold's own grant (and on Redlock, its agreed fence's
--         write-back) left there: if the first send ran, another call may have taken the lock
--         under the same token since, and its grant issued a larger fence than any of them.
-- Reply: 1 released; 0 not ours (the lease ended, or another owner holds it): nothing touched;
-- 2 (a resend alone) the key is gone while the counter still reads one of the fences: nobody
-- took the name since this hold's grant, so the first send deleted it or its lease ran out (the
-- caller, who knows when the lease ends, tells which).
-- With live waiters in the queue, the first is granted the lock at once (its grant is
-- published); otherwise the wake-up message is '' (for all).
-- (Inline, not a local function: the common release would pay for its closure on every call.)
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] and not ARGV[5] then
  return 0
end
if ARGV[5] then
  local counter = redis.call('GET', KEYS[2])
  local ours = false
  for i = 5, #ARGV do
    ours = ours or counter == ARGV[i]
  end
  if owner ~= ARGV[1] then
    if ours and not owner then
      return 2
    end
    return 0
  end
  if not ours then
    return 0
  end
end
-- The places, which the grant goes on from (none: nobody queues).
local queued = redis.call('HGETALL', KEYS[3])
if #queued == 0 then
  -- Every script publishes before it writes what its caller is told of: a user whose ACL
  -- forbids the channel (Redis 7 gives a new user none) is refused the PUBLISH, which ends the
  -- script with nothing changed, rather than after the writes (a script's error keeps those).
  -- Redis runs nothing else within a script: a waiter woken here finds the DEL done.
  redis.call('PUBLISH', ARGV[2], '')
  redis.call('DEL', KEYS[1])
  if KEYS[4] then
    redis.call('DEL', KEYS[4])
  end
  return 1
end
