-- Release a lock if ARGV[1] owns it, and wake the waiters (appended to queue_prune.lua).
-- KEYS[1] lock key   KEYS[2] queue   KEYS[3] place deadlines
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 released; 0 not ours (the lease ended, or another owner holds it): nothing touched.
-- The wake-up message is the token of the first live waiter in the fair queue, or '' for all.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local head = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  prune_queue(KEYS[2], KEYS[3], server_now_ms())
  head = redis.call('LINDEX', KEYS[2], 0)
end
redis.call('PUBLISH', ARGV[2], head or '')
return 1
