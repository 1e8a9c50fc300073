-- Shared prelude of the scripts that keep leases in a zset (token -> lease end in ms, server clock):
-- semaphore holders and read-write lock readers. After clock.lua (for server_clock), before the
-- other leases_*.lua preludes a script needs; not run alone. A lease counts while its end lies
-- after the server's `now`; no client clock is ever used. Each script takes only the preludes
-- whose functions it calls (a test in script_sources.rs checks it; see clock.lua).

-- The server's clock in ms (server_clock's first reading).
local function server_now_ms()
  return (server_clock())
end

-- An integer as the decimal string Redis expects (Lua would print a large number with an exponent).
local function int(x)
  return string.format('%d', x)
end
