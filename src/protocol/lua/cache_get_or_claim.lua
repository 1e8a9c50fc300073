-- Look up a cache entry and, on a miss, claim its fill: the check, the claim and the re-check
-- in one atomic step, so of all callers that miss, exactly one claims.
-- KEYS[1] value key (string: the stored payload, expiring with the entry's ttl)
-- KEYS[2] fill claim (string: the filler's token, expiring with the claim's lease)
-- ARGV[1] token   ARGV[2] claim lease in ms
-- ARGV[3] SHA-1 (hex) of a payload the caller saw and cannot use (it does not decode, or it is
--         due for an early refresh): a value with this digest counts as absent; '' for none.
-- Reply: {1, payload, pttl} a value is stored; pttl = ms it has left (-1: no expiry);
--        {2, lease_ms}      ARGV[1] holds the fill claim now (also when a retry finds its own
--                           token in place): the caller fills and stores;
--        {0, pttl}          another caller holds the claim; pttl = ms left on its lease.
-- A value of another type than string (a foreign key) counts as absent; the store replaces it.
local payload = redis.pcall('GET', KEYS[1])
if type(payload) == 'string' and (ARGV[3] == '' or redis.sha1hex(payload) ~= ARGV[3]) then
  return {1, payload, redis.call('PTTL', KEYS[1])}
end
local owner = redis.call('GET', KEYS[2])
if owner == false then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {2, tonumber(ARGV[2])}
end
if owner == ARGV[1] then
  return {2, redis.call('PTTL', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[2])}
