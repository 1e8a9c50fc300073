-- Shared prelude of the lock's release and leave (after clock.lua and waitlist.lua; not run
-- alone): hands a free lock straight to the first live waiter of the queue ("grant on release"),
-- so the waiter holds it without asking. The grant's lease is the waiter's own, but at most the
-- time left on its place plus `slack_ms`: a waiter that died while queued keeps the lock at most
-- `slack_ms` longer than it would have kept its place.
-- The grant is published as '<token> <fence> <lease ms>' on the waiter's inbox, `channel` ..
-- ':' .. its inbox id, which only the waiter's process listens to (or on `channel` when it
-- named no inbox), before anything is written (see lock_release.lua), so its fence is worked out
-- from a read of the counter first: max(counter + 1, now_us), as next_fence (fence_next.lua)
-- issues it. The counter's expiry is set to `fence_ttl_ms` (see fence_next.lua).
-- `now`: the server's clock in ms; `now_us`: the same reading in µs (server_clock in clock.lua),
-- the fence's clock. `all`: the places as HGETALL read them (optional; else read here).
-- `writes` (optional): a list the grant's writes are appended to, as commands, for the caller
-- to run once every wake-up of its script is published (multi_release.lua); else run here.
-- Reply: true if the lock was granted (and the grant published).
local function grant_head(lock_key, fence_key, places_key, channel, slack_ms, now, fence_ttl_ms,
                          now_us, all, writes)
  local first, lease, deadline, inbox = live_head(places_key, now, all)
  if not first then
    return false
  end
  local px = string.format('%d', math.max(math.min(lease, deadline - now + slack_ms), 1))
  local counter = tonumber(redis.call('GET', fence_key) or '0') or 0
  local fence = string.format('%d', math.max(counter + 1, now_us))
  if inbox ~= '' then
    channel = channel .. ':' .. inbox
  end
  redis.call('PUBLISH', channel, first .. ' ' .. fence .. ' ' .. px)
  if writes then
    writes[#writes + 1] = {'SET', lock_key, first, 'PX', px}
    writes[#writes + 1] = {'HDEL', places_key, first}
    writes[#writes + 1] = {'SET', fence_key, fence, 'PX', fence_ttl_ms}
  else
    -- (Called directly: a table per command would cost Redis more on every hand-off.)
    redis.call('SET', lock_key, first, 'PX', px)
    redis.call('HDEL', places_key, first)
    redis.call('SET', fence_key, fence, 'PX', fence_ttl_ms)
  end
  return true
end
