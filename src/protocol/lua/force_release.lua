-- Force release (the command line's `release NAME --force`): frees everything held under one
-- name, whoever holds it, as the holders' own releases would: the lock (when ARGV[2] is not
-- empty, only if that is still the holder the user confirmed), the semaphore's permits, the
-- RWLock's writer, readers and waiting writers' places, the cache entry's fill claim. Then one empty message on the
-- wake-up channel wakes every waiter (an empty message names nobody, so it wakes all of them,
-- fair or not); in a fair queue the head then takes what was freed itself. Leases in zsets
-- count only while their end (server ms) is ahead of the server's TIME.
-- KEYS[1] lock   KEYS[2] semaphore holders   KEYS[3] rwlock writer   KEYS[4] rwlock readers
-- KEYS[5] cache fill claim   KEYS[6] the re-entrant lock's hold counts (freed with the lock)
-- KEYS[7] rwlock waiting writers (zset token -> place deadline, server ms): a dead waiting
--         writer's place holds new readers back until it lapses; a live one takes it again at
--         its next refresh
-- KEYS[8] the semaphore's live limit   KEYS[9] the semaphore's waiters' place deadlines: the
--         limit goes with the permits unless a waiter still keeps a place (see semaphore_wake.lua)
-- ARGV[1] wake-up channel   ARGV[2] expected lock holder token or ''
-- Reply: {lock token or false, live semaphore holders, writer token or false, live readers,
--         fill claim token or false, live waiting writers' places}; -1: the lock's holder changed (nothing touched).
local lock = redis.call('GET', KEYS[1])
if ARGV[2] ~= '' and lock ~= ARGV[2] then
  return -1
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local holders = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local writer = redis.call('GET', KEYS[3])
local readers = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
local fill = redis.call('GET', KEYS[5])
local waiting = redis.call('ZCOUNT', KEYS[7], '(' .. now, '+inf')
-- (Published first: see lock_release.lua.)
if lock or holders > 0 or writer or readers > 0 or fill or waiting > 0 then
  redis.call('PUBLISH', ARGV[1], '')
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
if redis.call('EXISTS', KEYS[9]) == 0 then
  redis.call('DEL', KEYS[8])
end
return {lock, holders, writer, readers, fill, waiting}
