-- Extend the leases of a MultiLock's names if ARGV[1] holds every one: compare-and-pexpire.
-- KEYS: the lock key of each name   ARGV[1] token   ARGV[2] new lease in ms, counted from now
-- ARGV[2 + i] wake-up channel of name i: a lease cut short publishes '' there (see
--             lock_extend.lua)
-- Reply: 1 extended (every name); 0 some name is not ours (its lease ended, or another owner
-- holds it): nothing touched.
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
-- Every name's wake-up is published before any lease changes (see lock_release.lua).
local ms = tonumber(ARGV[2])
for i = 1, #KEYS do
  if redis.call('PTTL', KEYS[i]) > ms then
    redis.call('PUBLISH', ARGV[2 + i], '')
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
