-- Take one slot of a semaphore on one Redlock master (after the preludes scripts.rs puts
-- before it).
-- On Redlock a permit is a slot (0 .. limit-1) won on a majority of the masters: each slot is a
-- mutex kept by majority, so at most `limit` holders can each hold a majority (docs/scale-out.md).
-- KEYS[1] holders (zset token -> lease end, server ms), as on one server
-- KEYS[2] slots (hash: 's<i>' -> the token holding slot i, 't<token>' -> its slot, 'limit' -> the
--         live limit); it never expires before KEYS[1] (acquire and extend stretch it)
-- ARGV[1] token   ARGV[2] lease in ms   ARGV[3] limit (>= 1)   ARGV[4] the slot asked for (< limit)
-- ARGV[5] how many free slots a refusal names at most
-- Reply: {1, slot} granted (also for a retry that finds its own live lease on that slot; a live
--        lease of the token on another slot is an earlier round's grant whose give-back never
--        landed here, since a permit asks for no other slot: it goes, and the slot asked for is
--        tried as for any token, so that it never passes for a vote, or for part of the hold);
--        {0, ms, free...} the slot is taken here; ms = when its holder's lease ends; free = other
--        slots free here (up to ARGV[5], the ones after the slot asked for first);
--        {2, live} refused, nothing written: live holders use another limit (`live`).
local now = server_now_ms()
local token = ARGV[1]
local held = prune_leases(KEYS[1], now)
if redis.call('ZSCORE', KEYS[1], token) then
  local mine = redis.call('HGET', KEYS[2], 't' .. token)
  if mine == ARGV[4] then
    return {1, tonumber(mine)}
  end
  redis.call('ZREM', KEYS[1], token)
  redis.call('HDEL', KEYS[2], 't' .. token)
  if mine and redis.call('HGET', KEYS[2], 's' .. mine) == token then
    redis.call('HDEL', KEYS[2], 's' .. mine)
  end
  held = held - 1
end
local live = redis.call('HGET', KEYS[2], 'limit')
if live and live ~= ARGV[3] and held > 0 then
  return {2, tonumber(live)}
end

-- The live holder of slot `i` here, or false (a holder whose lease ended holds nothing).
local function holder_of(i)
  local holder = redis.call('HGET', KEYS[2], 's' .. i)
  if holder and redis.call('ZSCORE', KEYS[1], holder) then
    return holder
  end
  return false
end

local limit = tonumber(ARGV[3])
local slot = tonumber(ARGV[4])
local holder = holder_of(slot)
if not holder then
  local stale = redis.call('HGET', KEYS[2], 's' .. slot)
  if stale then
    redis.call('HDEL', KEYS[2], 't' .. stale)
  end
  redis.call('HSET', KEYS[2], 's' .. slot, token, 't' .. token, slot, 'limit', ARGV[3])
  local ms = grant_lease(KEYS[1], token, tonumber(ARGV[2]), now)
  if redis.call('PTTL', KEYS[2]) < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
  end
  return {1, slot}
end

local reply = {0, math.max(tonumber(redis.call('ZSCORE', KEYS[1], holder)) - now, 1)}
if held < limit then
  local want = tonumber(ARGV[5])
  local i = (slot + 1) % limit
  local looked = 1
  while looked < limit and looked <= 1024 and #reply - 2 < want do
    if not holder_of(i) then
      table.insert(reply, i)
    end
    i = (i + 1) % limit
    looked = looked + 1
  end
end
return reply
