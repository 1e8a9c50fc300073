-- Shared prelude of the fair lock's release and leave (after queue_prune.lua, fence_next.lua and
-- waitlist.lua; not run alone):
-- hands a free lock straight to the first live waiter of the waitlist ("grant on release"), so
-- the waiter holds it without asking. The grant's lease is the waiter's own, but at most the time
-- left on its place plus `slack_ms`: a waiter that died while queued keeps the lock at most
-- `slack_ms` longer than it would have kept its place.
-- The grant is published as '<token> <fence> <lease ms>' on the waiter's inbox, `channel` ..
-- ':' .. its inbox id, which only the waiter's process listens to (or on `channel` when it
-- named no inbox). The fence counter's expiry is set to `fence_ttl_ms` (see fence_next.lua).
-- `now`: the server's clock in ms; `now_us`: the same reading in µs (server_clock in
-- queue_prune.lua), the fence's clock.
-- `head`: the waitlist's first token as the caller read it already (optional; else read here).
-- `alone`: true when the caller saw that nobody waits behind `head` (optional): a grant then
-- empties the waitlist, and deletes both its keys in one command instead of taking the head out
-- of each. Lapsed places are dropped only from the front (live_head in waitlist.lua).
-- Reply: true if the lock was granted (and the grant published).
local function grant_head(lock_key, fence_key, waitlist_key, places_key, channel, slack_ms, now,
                          fence_ttl_ms, now_us, head, alone)
  local first, lease, deadline, inbox = live_head(waitlist_key, places_key, now, head)
  if not first then
    return false
  end
  if first ~= head then
    -- Lapsed places went: whether another waits behind the new head is not known.
    alone = redis.call('LLEN', waitlist_key) == 1
  end
  local px = math.max(math.min(lease, deadline - now + slack_ms), 1)
  redis.call('SET', lock_key, first, 'PX', px)
  if alone then
    redis.call('DEL', waitlist_key, places_key)
  else
    redis.call('LPOP', waitlist_key)
    redis.call('HDEL', places_key, first)
  end
  local fence = next_fence(fence_key, fence_ttl_ms, now_us)
  if inbox ~= '' then
    channel = channel .. ':' .. inbox
  end
  redis.call('PUBLISH', channel, first .. ' ' .. string.format('%d', fence) .. ' '
    .. string.format('%d', px))
  return true
end
