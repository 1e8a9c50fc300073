-- Re-enter a re-entrant lock (Lock(reentrant=True)): its owner takes it once more, or gives back
-- one of its nested acquires; the lock stays held either way. The hold count lives beside the
-- lock while it is 2 or more, as '<token> <count>' (a count of another token is stale: it
-- belonged to a hold that was lost), expiring with the lock's lease. The caller keeps the count
-- and sends the new one, so a resend after a dropped connection changes nothing.
-- KEYS[1] lock key (string: owner token)   KEYS[2] hold count (string '<token> <count>')
-- ARGV[1] token   ARGV[2] the hold count after this step (1: the outermost hold alone)
-- ARGV[3] lease in ms: the lease then lasts at least this long from now (a re-entry; '0' for a
--         nested release, which leaves the lease as it is)
-- Reply: 1 done; 0 ARGV[1] does not hold the lock (the lease ended, or another owner holds it):
--        nothing touched.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local left = redis.call('PTTL', KEYS[1])
local lease = tonumber(ARGV[3])
if lease > 0 and left < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
  left = lease
end
if tonumber(ARGV[2]) > 1 then
  redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'PX', math.max(left, 1))
else
  redis.call('DEL', KEYS[2])
end
return 1
