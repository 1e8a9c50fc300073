-- A waiting writer gives up: take its place back at once (after the preludes scripts.rs puts
-- before it).
-- KEYS[1] writer (string)   KEYS[2] waiting writers (zset token -> place deadline, server ms)
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 if the token was waiting, else 0. When it was the last waiting writer and no writer
-- holds the lock, everybody is woken (''): the readers it held back may go now.
-- The places are counted before this one goes: the key goes with its last place, and while its
-- slot migrates Redis Cluster refuses a script's command on a key the script deleted (after the
-- commands before it ran).
local places, removed = redis.call('ZCARD', KEYS[2]), 0
if places > 0 then
  removed = redis.call('ZREM', KEYS[2], ARGV[1])
  places = places - removed
end
if removed == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  if places > 0 then
    places = places - redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(server_now_ms()))
  end
  if places == 0 then
    redis.call('PUBLISH', ARGV[2], '')
  end
end
return removed
