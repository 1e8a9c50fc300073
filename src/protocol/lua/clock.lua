-- Shared prelude (prepended to the scripts that read the server's clock, not run alone): the
-- server's TIME, so client clocks never matter. TIME's two strings go into arithmetic as they
-- are (Lua converts them): a tonumber call on each costs Redis more.
-- Every script's preludes hold only what it calls (a test in script_sources.rs checks it): a
-- script's chunk runs on every call, and each `local function` in it costs Redis a new closure
-- each time.

-- The server's clock in ms and the same reading in µs, for a script that also issues a fence
-- (next_fence in fence_next.lua takes the µs) or orders places (waitlist.lua): one TIME call
-- serves the whole script.
local function server_clock()
  local t = redis.call('TIME')
  local s, us = t[1] + 0, t[2] + 0
  return s * 1000 + (us - us % 1000) / 1000, s * 1000000 + us
end
