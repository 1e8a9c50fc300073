-- Release a lock if ARGV[1] owns it, and hand it on. Without a fair queue it ends here (the
-- common case: the grant preludes that follow, queue_prune.lua, fence_next.lua, waitlist.lua
-- and lock_grant.lua, are then not run at all); with one, lock_release_grant.lua goes on.
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] waitlist   KEYS[4] its places (see
-- waitlist.lua)
-- ARGV[1] token   ARGV[2] wake-up channel   ARGV[3] grant slack in ms (see lock_grant.lua)
-- ARGV[4] fence counter's ttl in ms (see fence_next.lua)
-- Reply: 1 released; 0 not ours (the lease ended, or another owner holds it): nothing touched.
-- With live waiters in the fair queue, the first is granted the lock at once (its grant is
-- published); otherwise the wake-up message is '' (for all).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- The queue's first two tokens: the head (nil: nobody queues), which the grant goes on from,
-- and whether another waits behind it.
local queued = redis.call('LRANGE', KEYS[3], 0, 1)
local head = queued[1]
if not head then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
