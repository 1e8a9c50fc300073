-- Shared prelude of the lock's release and leave (after clock.lua, fence_next.lua and
-- waitlist.lua; not run alone): hands a free lock straight to the first live waiter of the queue
-- ("grant on release"), so the waiter holds it without asking. The grant's lease is the waiter's
-- own, but at most the time left on its place plus `slack_ms`: a waiter that died while queued
-- keeps the lock at most `slack_ms` longer than it would have kept its place.
-- The grant is published as '<token> <fence> <lease ms>' on the waiter's inbox, `channel` ..
-- ':' .. its inbox id, which only the waiter's process listens to (or on `channel` when it
-- named no inbox). The fence counter's expiry is set to `fence_ttl_ms` (see fence_next.lua).
-- `now`: the server's clock in ms; `now_us`: the same reading in µs (server_clock in clock.lua),
-- the fence's clock. `all`: the places as HGETALL read them (optional; else read here).
-- Reply: true if the lock was granted (and the grant published).
local function grant_head(lock_key, fence_key, places_key, channel, slack_ms, now, fence_ttl_ms,
                          now_us, all)
  local first, lease, deadline, inbox = live_head(places_key, now, all)
  if not first then
    return false
  end
  local px = string.format('%d', math.max(math.min(lease, deadline - now + slack_ms), 1))
  redis.call('SET', lock_key, first, 'PX', px)
  redis.call('HDEL', places_key, first)
  local _, fence = next_fence(fence_key, fence_ttl_ms, now_us)
  if inbox ~= '' then
    channel = channel .. ':' .. inbox
  end
  redis.call('PUBLISH', channel, first .. ' ' .. fence .. ' ' .. px)
  return true
end
