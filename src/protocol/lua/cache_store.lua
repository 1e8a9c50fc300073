-- Store a filled value if ARGV[1] still holds the fill claim, give the claim back and wake the
-- waiters, who read the value.
-- KEYS[1] value key   KEYS[2] fill claim
-- ARGV[1] token   ARGV[2] payload   ARGV[3] the entry's ttl in ms   ARGV[4] wake-up channel
-- Reply: 1 stored; 0 not stored, nothing touched: the claim is not ours any more (its lease
--        ended, or the entry was invalidated while the fill ran, so the value may predate that).
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
-- (Published first: see lock_release.lua.)
redis.call('PUBLISH', ARGV[4], '')
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
