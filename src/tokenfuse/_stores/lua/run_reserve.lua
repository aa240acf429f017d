--[[
run_reserve.lua: hold a call's estimate before it is sent, or refuse it (budget.reserve).
A run nobody opened is started without limits (it counts, refuses nothing).

KEYS[1]  the run's state string  <prefix>:{run:<hash>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  ttl, seconds
ARGV[4]  tokens to hold
ARGV[5]  usd to hold

Calls TIME (unless ARGV[1] is given), GET and SET ... PX. Returns 'allowed unit near exceeded'
then the run's nine doubles (_budget.lua).
--]]

local now = clock(ARGV[1])
local ttl = tonumber(ARGV[3])
local r = load_run(KEYS[1], now) or new_run(now, ttl, NO_LIMIT, NO_LIMIT)
local allowed, unit = run_reserve(r, now, ttl, tonumber(ARGV[4]), tonumber(ARGV[5]))
local near, exceeded = run_alerts(r, allowed)
save_run(KEYS[1], ARGV[2], r)
return run_reply(allowed, unit, near, exceeded, r)
