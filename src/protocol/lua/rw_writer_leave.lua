-- A waiting writer gives up: take its place back at once (after the preludes scripts.rs puts
-- before it).
-- KEYS[1] writer (string)   KEYS[2] waiting writers (zset token -> place deadline, server ms)
-- ARGV[1] token   ARGV[2] wake-up channel
-- Reply: 1 if the token was waiting, else 0. When it was the last waiting writer and no writer
-- holds the lock, everybody is woken (''): the readers it held back may go now.
-- The places are counted before this one goes, and it goes last, after the wake-up (see
-- lock_release.lua; a lapsed place may go before, with the others): the key goes with its last
-- place, and while its slot migrates Redis Cluster refuses a script's command on a key the
-- script deleted (after the commands before it ran).
local places, own = redis.call('ZCARD', KEYS[2]), false
if places > 0 then
  own = redis.call('ZSCORE', KEYS[2], ARGV[1])
end
if not own then
  return 0
end
local others, dropped = places - 1, false
if redis.call('EXISTS', KEYS[1]) == 0 then
  if others > 0 then
    local now = server_now_ms()
    local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
    if tonumber(own) <= now then
      dropped, lapsed = true, lapsed - 1
    end
    others = others - lapsed
  end
  if others == 0 then
    redis.call('PUBLISH', ARGV[2], '')
  end
end
if not dropped then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
