--[[
run_settle.lua: replace a reservation by what the call spent; 0 and 0 release it
(budget.settle).

KEYS[1]  the run's state string  <prefix>:{run:<hash>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  ttl, seconds
ARGV[4]  tokens held, ARGV[5] usd held
ARGV[6]  tokens spent, ARGV[7] usd spent

Calls TIME (unless ARGV[1] is given), GET and SET ... PX. Returns 'allowed unit near exceeded'
then the run's nine doubles (_budget.lua).
--]]

local now = clock(ARGV[1])
local ttl = tonumber(ARGV[3])
local r = load_run(KEYS[1], now) or new_run(now, ttl, NO_LIMIT, NO_LIMIT)
run_settle(r, now, ttl, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
  tonumber(ARGV[7]))
local near, exceeded = run_alerts(r, 1)
save_run(KEYS[1], ARGV[2], r)
return run_reply(1, 0, near, exceeded, r)
