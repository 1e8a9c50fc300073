-- Acquire a lock in FIFO order (after queue_prune.lua, fence_next.lua and waitlist.lua).
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] waitlist (tokens in arrival order)
-- KEYS[4] its places (token -> '<lease ms> <place deadline ms> <inbox>'; see waitlist.lua)
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] how long a silent waiter keeps its place, in ms
-- ARGV[4] '1': join (or stay in) the queue when not granted; '0': try once, never queue;
--         'b': an unfair lock's waiter: take a free lock even past the queue (as lock_acquire.lua
--         does), and only when it is taken, join the queue as '1' does
-- ARGV[5] the waiter's inbox: hex id of the process's subscriber, or '' (see lock_grant.lua)
-- ARGV[6] fence counter's ttl in ms (after the last fence; see fence_next.lua)
-- Reply: {1, fence} granted (also when the token holds the lock already: a retry, or a grant
--        by a release; its lease is then renewed to ARGV[2] from now);
--        {0, ms, fence} not granted; ms = when to look again at the latest: the holder's lease
--        end, or, while the lock is free but another live waiter is first, when that waiter's
--        place lapses; fence = the fence counter now (a grant with a larger fence came later).
-- Lapsed places are dropped from the front before the queue's head decides who may take a free
-- lock; with no queue (nobody waiting: the common case) there is nothing to drop before the lock
-- is taken or the queue is started. While another holds the lock a join drops nothing: lapsed
-- places are dropped before they could come first (here, or by the grant, lock_grant.lua).
local barge = ARGV[4] == 'b'
local head, now, now_us, head_deadline

-- A fair attempt's first look, where SET can GET, is the take itself: it takes a free lock, else
-- reads the owner (see fence_next.lua); a fair waiter that took a free lock checks the queue
-- then, and gives the lock back if a live waiter is ahead of it (rare: a grant on release
-- leaves a lock free while a live waiter queues only when a holder's lease ran out). An unfair
-- waiter's join comes after its first attempt found the lock held, and mostly finds it held
-- again: a plain read costs Redis less there than a SET that does not take. While another holds
-- the lock, the queue is read only to refresh a place (below).
local owner, took
if set_get and not barge then
  owner = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  took = owner == false
else
  owner = redis.call('GET', KEYS[1])
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, current_fence(KEYS[2], ARGV[6])}
end

if owner == false then
  -- The lock is free. An unfair waiter takes it whoever queues; a fair one only when no live
  -- waiter comes first (lapsed places in front are dropped): the first live waiter's place
  -- deadline tells the others when to look again.
  if not barge then
    head = redis.call('LINDEX', KEYS[3], 0)
    if head then
      now, now_us = server_clock()
      local _
      head, _, head_deadline = live_head(KEYS[3], KEYS[4], now, head)
      head = head or false
    end
  end
  if barge or not head or head == ARGV[1] then
    if not took then
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    end
    if head == ARGV[1] then
      redis.call('LPOP', KEYS[3])
      redis.call('HDEL', KEYS[4], ARGV[1])
    elseif barge and redis.call('HDEL', KEYS[4], ARGV[1]) == 1 then
      -- (a resend whose first send joined: the place is given up with the lock taken)
      redis.call('LREM', KEYS[3], 1, ARGV[1])
    end
    return {1, next_fence(KEYS[2], ARGV[6], now_us)}
  end
  if took then
    -- Not this waiter's to take: left free, as it was, for the one first in the queue.
    redis.call('DEL', KEYS[1])
  end
end

if ARGV[4] == '1' or barge then
  -- The place's record is written on every join; a token it is new for (no place yet, or its
  -- lapsed place was dropped) goes to the end of the waitlist, and one that finds its place
  -- keeps it (a refresh).
  now = now or server_now_ms()
  local place = tonumber(ARGV[3])
  local record = place_record(ARGV[2], now + place, ARGV[5])
  local start
  if redis.call('HSET', KEYS[4], ARGV[1], record) == 1 then
    start = redis.call('RPUSH', KEYS[3], ARGV[1]) == 1
  else
    -- A refresh (a waiter that found the lock held has not read the waitlist yet). A record
    -- without a waitlist (none of the scripts leaves one) starts it again rather than stand for
    -- a place in none.
    if head == nil then
      head = redis.call('LINDEX', KEYS[3], 0)
    end
    start = not head
    if start then
      redis.call('RPUSH', KEYS[3], ARGV[1])
    end
  end
  -- Both keys must outlive every live place (each ends within `place` ms from now). They are
  -- given half a place more than that, so that most joins find them lasting long enough
  -- already (one PTTL instead of two PEXPIREs); they are set together, so the places' hash tells
  -- for both.
  if start or redis.call('PTTL', KEYS[4]) < place then
    local keep = place + math.floor(place / 2)
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
  end
end

local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if owner then
  return {0, redis.call('PTTL', KEYS[1]), fence}
end
-- Here another live waiter is first (else the lock was granted): live_head read its deadline.
return {0, math.max(head_deadline - now, 1), fence}
