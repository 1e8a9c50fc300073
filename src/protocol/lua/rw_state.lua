-- Who holds a read-write lock (read only; after the preludes scripts.rs puts before it).
-- KEYS[1] readers (zset token -> lease end, server ms)   KEYS[2] writer (string)   ARGV: none
-- Reply: {writer, readers}: 1 if a writer holds it, else 0; the number of live readers.
local readers = redis.call('ZCOUNT', KEYS[1], '(' .. int(server_now_ms()), '+inf')
return {redis.call('EXISTS', KEYS[2]), readers}
