-- Extend a lease if ARGV[1] owns the lock: compare-and-pexpire.
-- KEYS[1] lock key   ARGV[1] token   ARGV[2] new lease in ms, counted from now
-- ARGV[3] wake-up channel (optional): a lease cut shorter than what was left publishes '' there,
--         since waiters sleep until the end they last read and would sleep past the new one
-- Reply: 1 extended; 0 not ours (the lease ended, or another owner holds it).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local left = ARGV[3] and redis.call('PTTL', KEYS[1])
  -- (Published first: see lock_release.lua.)
  if left and left > tonumber(ARGV[2]) then
    redis.call('PUBLISH', ARGV[3], '')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
