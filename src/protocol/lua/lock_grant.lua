-- Shared prelude of the fair lock's release and leave (after queue_prune.lua and fence_next.lua;
-- not run alone):
-- hands a free lock straight to the first live waiter of the queue ("grant on release"), so the
-- waiter holds it without asking. The grant's lease is the waiter's own, but at most the time
-- left on its place plus `slack_ms`: a waiter that died while queued keeps the lock at most
-- `slack_ms` longer than it would have kept its place.
-- The grant is published as '<token> <fence> <lease ms>' on the waiter's inbox, `channel` ..
-- ':' .. its inbox id, which only the waiter's process listens to (or on `channel` when it
-- named no inbox). A head whose lease is not recorded (queued by an older client) is only
-- woken, on `channel` with its bare token, to take the lock itself. The fence counter's
-- expiry is set to `fence_ttl_ms` (see fence_next.lua). `now`: the server's clock in ms;
-- `now_us`: the same reading in µs (server_clock in queue_prune.lua), the fence's clock.
-- `head`: the queue's first token as the caller read it already (optional; else read here).
-- `alone`: true when the caller saw that nobody queues behind `head` (optional): a grant then
-- empties the queue, and deletes its three keys in one command instead of taking the head out
-- of each (what else the deadlines or leases still hold belongs to no place in the queue).
-- Lapsed places are pruned only when the head's own place lapsed (or is not recorded): a live
-- head is granted as it is, and places lapsed behind it are pruned before they could come
-- first (by a later grant, or a join that finds the lock free), or expire with the queue keys.
-- Reply: true if a message was published; then true if the lock was set to the head's token
-- (a head that is only woken finds it free).
local function grant_head(lock_key, fence_key, queue_key, deadline_key, lease_key, channel,
                          slack_ms, now, fence_ttl_ms, now_us, head, alone)
  head = head or redis.call('LINDEX', queue_key, 0)
  if not head then
    return false, false
  end
  local deadline = tonumber(redis.call('ZSCORE', deadline_key, head))
  if not (deadline and deadline > now) then
    if prune_queue(queue_key, deadline_key, now, lease_key) > 0 then
      alone = false
      head = redis.call('LINDEX', queue_key, 0)
      if not head then
        return false, false
      end
      deadline = tonumber(redis.call('ZSCORE', deadline_key, head))
    end
  end
  local lease, inbox = string.match(redis.call('HGET', lease_key, head) or '', '^(%d+) ?(%x*)$')
  lease = tonumber(lease)
  if not lease then
    redis.call('PUBLISH', channel, head)
    return true, false
  end
  local place_left = (deadline or now) - now
  local px = math.max(math.min(lease, place_left + slack_ms), 1)
  redis.call('SET', lock_key, head, 'PX', px)
  if alone then
    redis.call('DEL', queue_key, deadline_key, lease_key)
  else
    redis.call('LPOP', queue_key)
    redis.call('ZREM', deadline_key, head)
    redis.call('HDEL', lease_key, head)
  end
  local fence = next_fence(fence_key, fence_ttl_ms, now_us)
  if inbox ~= '' then
    channel = channel .. ':' .. inbox
  end
  redis.call('PUBLISH', channel, head .. ' ' .. string.format('%d', fence) .. ' '
    .. string.format('%d', px))
  return true, true
end
