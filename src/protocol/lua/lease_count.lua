-- Count the live leases of a zset (read only; after the preludes scripts.rs puts before it).
-- KEYS[1] leases (zset token -> lease end, server ms)   ARGV: none
-- Reply: the number of leases that end after now (server clock).
return redis.call('ZCOUNT', KEYS[1], '(' .. int(server_now_ms()), '+inf')
