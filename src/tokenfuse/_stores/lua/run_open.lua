--[[
run_open.lua: open a run with its limits, or join it keeping the limits it has
(budget.open_run).

KEYS[1]  the run's state string  <prefix>:{run:<hash>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  ttl, seconds (the state's own expiry, for an injected clock)
ARGV[4]  token limit (-1 = none)
ARGV[5]  usd limit (-1 = none)
ARGV[6]  '1' to join, '0' to open

Calls TIME (unless ARGV[1] is given), GET and SET ... PX. Returns 'allowed unit near exceeded'
then the run's nine doubles (_budget.lua).
--]]

local now = clock(ARGV[1])
local ttl = tonumber(ARGV[3])
local r = open_run(load_run(KEYS[1], now), now, ttl, tonumber(ARGV[4]), tonumber(ARGV[5]),
  ARGV[6] == '1')
save_run(KEYS[1], ARGV[2], r)
return run_reply(1, 0, 0, 0, r)
