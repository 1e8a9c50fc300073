-- Release a lock if ARGV[1] owns it, the way python-redis-lock releases (for the drop-in shim
-- `redmutex.compat.redis_lock`): its waiters BLPOP the signal list, redmutex's hear the channel.
-- KEYS[1] lock key (`lock:NAME`)   KEYS[2] signal list (`lock-signal:NAME`)
-- ARGV[1] token   ARGV[2] wake-up channel   ARGV[3] signal list's expiry in ms
-- KEYS[3] fence counter, ARGV[4..] fences (optional): the resend of a release of a token the
--         caller chose after its connection dropped releases only while the counter reads one
--         of them (see lock_release.lua's ARGV[5..]).
-- Reply: 1 released; 0 not ours (the lease ended, or another owner holds it): nothing touched.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if KEYS[3] then
  local counter = redis.call('GET', KEYS[3])
  local ours = false
  for i = 4, #ARGV do
    ours = ours or counter == ARGV[i]
  end
  if not ours then
    return 0
  end
end
-- (Published first: see lock_release.lua.)
redis.call('PUBLISH', ARGV[2], '')
redis.call('DEL', KEYS[1])
-- The signal list becomes exactly one element: pushed, then trimmed to it (a DEL before the push
-- would make the push touch a key this script deleted, which Redis Cluster refuses while the
-- slot migrates, after the commands before it ran).
redis.call('LPUSH', KEYS[2], 1)
redis.call('LTRIM', KEYS[2], 0, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
