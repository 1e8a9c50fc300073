-- Extend the lease of a re-entrant lock if ARGV[1] owns it: compare-and-pexpire of the lock and
-- of its hold count (see lock_reenter.lua), which expire together.
-- KEYS[1] lock key   KEYS[2] hold count (string '<token> <count>')
-- ARGV[1] token   ARGV[2] new lease in ms, counted from now
-- ARGV[3] wake-up channel: a lease cut short publishes '' there (see lock_extend.lua)
-- Reply: 1 extended; 0 not ours (the lease ended, or another owner holds it).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- (Published first: see lock_release.lua.)
if redis.call('PTTL', KEYS[1]) > tonumber(ARGV[2]) then
  redis.call('PUBLISH', ARGV[3], '')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local held = redis.call('GET', KEYS[2])
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
