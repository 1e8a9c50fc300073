-- Give a fill claim back without a value (the fill failed, or its caller gave up) and wake the
-- waiters: the first to try again claims the fill and takes it over.
-- KEYS[1] fill claim   ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 given back; 0 not ours (its lease ended, or the entry was invalidated): nothing touched.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- (Published first: see lock_release.lua.)
redis.call('PUBLISH', ARGV[2], '')
redis.call('DEL', KEYS[1])
return 1
