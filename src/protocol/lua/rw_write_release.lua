-- Release the write lock if ARGV[1] holds it, and wake every waiter (readers and writers).
-- KEYS[1] writer (string: token, PX lease)   ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 released; 0 not ours (the lease ended, or another writer holds it): nothing touched.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- (Published first: see lock_release.lua.)
redis.call('PUBLISH', ARGV[2], '')
redis.call('DEL', KEYS[1])
return 1
