-- Extend a lease if ARGV[1] owns the lock: compare-and-pexpire.
-- KEYS[1] lock key   ARGV[1] token   ARGV[2] new lease in ms, counted from now
-- Reply: 1 extended; 0 not ours (the lease ended, or another owner holds it).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
