-- Whether ARGV[1] holds a live lease in a zset (read only; after the preludes scripts.rs puts
-- before it).
-- KEYS[1] leases (zset token -> lease end, server ms)   ARGV[1] token
-- Reply: 1 live; 0 not (its lease ended, or it never held one).
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if lease_end and tonumber(lease_end) > (server_clock()) then
  return 1
end
return 0
