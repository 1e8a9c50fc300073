-- Acquire a lock in FIFO order (after clock.lua, fence_next.lua, fence_current.lua and
-- waitlist.lua).
-- KEYS[1] lock key   KEYS[2] fence counter   KEYS[3] the queue's places (see waitlist.lua)
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] how long a silent waiter keeps its place, in ms
-- ARGV[4] '1': join (or stay in) the queue when not granted; '0': try once, never queue;
--         'b': an unfair lock's waiter: take a free lock even past the queue (as lock_acquire.lua
--         does), and only when it is taken, join the queue as '1' does
-- ARGV[5] the waiter's inbox: hex id of the process's subscriber, or '' (see lock_grant.lua)
-- ARGV[6] fence counter's ttl in ms (after the last fence; see fence_next.lua)
-- ARGV[7] the lock's wake-up channel: a waiter that takes a free lock at the head of the queue
--         publishes '' there (see below)
-- Reply: the fence (an integer, as lock_acquire.lua's) granted (also when the token holds the
--        lock already: a retry, or a grant by a release; its lease is then renewed to ARGV[2]
--        from now);
--        {0, ms, fence} not granted; ms = when to look again at the latest: the holder's lease
--        end, or, while the lock is free but another live waiter is first, when that waiter's
--        place lapses; fence = the fence counter now (a grant with a larger fence came later).
-- Lapsed places are dropped from the front before the queue's head decides who may take a free
-- lock; with no queue (nobody waiting: the common case) there is nothing to drop before the lock
-- is taken or the queue is started. While another holds the lock a join drops nothing: lapsed
-- places are dropped before they could come first (here, or by the grant, lock_grant.lua).

-- A place's record (the format is waitlist.lua's; parse_place there reads it).
local function place_record(seq, deadline_ms, lease_ms, inbox)
  return seq .. ' ' .. string.format('%d', deadline_ms) .. ' ' .. lease_ms .. ' ' .. inbox
end

local barge = ARGV[4] == 'b'
local head, now, now_us, head_deadline

-- A fair attempt's first look, where SET can GET, is the take itself: it takes a free lock, else
-- reads the owner (see fence_next.lua); a fair waiter that took a free lock checks the queue
-- then, and gives the lock back if a live waiter is ahead of it (rare: a grant on release
-- leaves a lock free while a live waiter queues only when a holder's lease ran out). An unfair
-- waiter's join comes after its first attempt found the lock held, and mostly finds it held
-- again: a plain read costs Redis less there than a SET that does not take. While another holds
-- the lock, the queue is not read.
local owner, took
if set_get and not barge then
  owner = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  took = owner == false
else
  owner = redis.call('GET', KEYS[1])
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return current_fence(KEYS[2], ARGV[6])
end

if owner == false then
  -- The lock is free. An unfair waiter takes it whoever queues; a fair one only when no live
  -- waiter comes first (lapsed places in front are dropped): the first live waiter's place
  -- deadline tells the others when to look again.
  if not barge then
    local places = redis.call('HGETALL', KEYS[3])
    if #places > 0 then
      now, now_us = server_clock()
      local _
      head, _, head_deadline = live_head(KEYS[3], now, places)
    end
    head = head or false
  end
  if barge or not head or head == ARGV[1] then
    -- The waiters behind, and a MultiLock waiting for the name (it keeps no place), were told
    -- to look again when this one's place lapses (the lock was free, this one first): that it
    -- took the lock, whose lease may run out unreleased too, they learn now. (Taking at the
    -- head happens only after a lease ran out: a release grants the lock instead.) Published
    -- before this waiter's writes (see lock_release.lua); refused (the user may not use the
    -- channel), the lock its first look took is given back, and the refusal is the reply.
    if head == ARGV[1] then
      local told = redis.pcall('PUBLISH', ARGV[7], '')
      if type(told) == 'table' and told.err then
        if took then
          redis.call('DEL', KEYS[1])
        end
        return told
      end
    end
    if not took then
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    end
    -- (a barging resend whose first send joined gives its place up with the lock taken)
    if head == ARGV[1] or barge then
      redis.call('HDEL', KEYS[3], ARGV[1])
    end
    return (next_fence(KEYS[2], ARGV[6], now_us))
  end
  if took then
    -- Not this waiter's to take: left free, as it was, for the one first in the queue.
    redis.call('DEL', KEYS[1])
  end
end

if ARGV[4] == '1' or barge then
  -- A token new to the queue (no place yet, or its lapsed place was dropped) takes the last
  -- place (its seq is now); one that finds its place keeps its seq, with a new deadline, lease
  -- and inbox (a refresh).
  if not now then
    now, now_us = server_clock()
  end
  local place = ARGV[3] + 0
  local deadline = now + place
  -- The key must outlive every live place (each ends within `place` ms from now, or, for another
  -- waiter's, within its own place time of its last refresh, which set the expiry as this
  -- does). It is given half a place more, so that most refreshes find it lasting long enough
  -- already (one PTTL, no PEXPIRE). A new place in a new queue (the common join: nobody else
  -- waits) sets the expiry of the key it created (NX: it has none yet) without reading it.
  local keep = string.format('%d', place + (place - place % 2) / 2)
  local expiring = 0
  if redis.call('HSETNX', KEYS[3], ARGV[1],
                place_record(string.format('%d', now_us), deadline, ARGV[2], ARGV[5])) == 1 then
    if set_get then
      -- (PEXPIRE takes NX since Redis 7.0, as SET takes GET: see fence_next.lua)
      expiring = redis.call('PEXPIRE', KEYS[3], keep, 'NX')
    end
  else
    local seq = parse_place(redis.call('HGET', KEYS[3], ARGV[1]))
    redis.call('HSET', KEYS[3], ARGV[1],
               place_record(seq or string.format('%d', now_us), deadline, ARGV[2], ARGV[5]))
  end
  if expiring == 0 and redis.call('PTTL', KEYS[3]) < place then
    redis.call('PEXPIRE', KEYS[3], keep)
  end
end

local fence = redis.call('GET', KEYS[2]) or '0'
if owner then
  return {0, redis.call('PTTL', KEYS[1]), fence}
end
-- Here another live waiter is first (else the lock was granted): live_head read its deadline.
return {0, math.max(head_deadline - now, 1), fence}
