-- Extend the leases of a MultiLock's names if ARGV[1] holds every one: compare-and-pexpire.
-- KEYS: the lock key of each name   ARGV[1] token   ARGV[2] new lease in ms, counted from now
-- Reply: 1 extended (every name); 0 some name is not ours (its lease ended, or another owner
-- holds it): nothing touched.
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
