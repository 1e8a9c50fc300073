-- Acquire a lock (no queue): SET NX PX and the next fence in one atomic step (after
-- fence_next.lua and fence_current.lua).
-- KEYS[1] lock key (string: owner token)   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] fence counter's ttl in ms (after the last fence)
-- ARGV[#ARGV] 'first' (optional, always the last argument, after ARGV[3]): the first send of an
--        attempt whose token the caller chose (the recipes' identifier), and of its resend: a
--        token found in place may have been put there by another call with the same identifier,
--        so it is not a grant. Without it (a token the library drew, nobody else's) it is ours.
-- Reply: the fence (an integer) when ARGV[1] holds the lock now (a retry that finds its own
--        token in place counts: nobody else can have incremented the fence while we held it;
--        its lease is renewed to ARGV[2] from now, since the token may have been set by an
--        earlier attempt, e.g. a lost Redlock round whose give-back never landed, whose lease
--        would end before the one this attempt's caller counts on);
--        {0, pttl} when another owner holds it; pttl = ms left on its lease (-1: no lease).
--        (A grant is a bare integer because a table costs Redis about 5% of a whole
--        acquire+release pair to convert.)
local owner
if set_get then
  -- Takes the lock if it is free, else reads its owner (see fence_next.lua).
  owner = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  if owner == false then
    return (next_fence(KEYS[2], ARGV[3]))
  end
else
  owner = redis.call('GET', KEYS[1])
  if owner == false then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return (next_fence(KEYS[2], ARGV[3]))
  end
end
if owner == ARGV[1] and ARGV[#ARGV] ~= 'first' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return current_fence(KEYS[2], ARGV[3])
end
return {0, redis.call('PTTL', KEYS[1])}
