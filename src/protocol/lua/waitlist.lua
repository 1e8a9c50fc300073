-- Shared prelude of the lock's queue scripts (after clock.lua; not run alone). A lock's queue
-- (its fair waiters, and an unfair lock's waiters that wait) is one hash, its places:
--   token -> '<seq> <deadline ms> <lease ms> <inbox>'
-- seq: the server's clock in µs when the token took its place (16 digits from 2001 to 2286), so
-- the records sort as strings in arrival order and the first place is the smallest record;
-- deadline: until when (server clock) the place holds without a refresh; lease: what a grant
-- gives the waiter; inbox: where the grant is told (lock_grant.lua).
-- One key, not a list of tokens beside a hash of records: a join writes one field, a grant reads
-- one reply and removes one field (a hash goes with its last field), and one expiry covers it.
-- The order is the server clock's: a Redis host whose clock steps back by d serves a place taken
-- within d after the step before those taken within d before it (mutual exclusion never depends
-- on it).

-- seq (text), deadline and lease (numbers) and inbox of a record (lock_acquire_fair.lua's
-- place_record, the one writer of the format); nil for a record of another format (not one of
-- ours: it never counts as a live place).
local function parse_place(record)
  local seq, deadline, lease, inbox = string.match(record, '^(%d+) (%d+) (%d+) (%x*)$')
  if not seq then
    return nil
  end
  return seq, deadline + 0, lease + 0, inbox
end
