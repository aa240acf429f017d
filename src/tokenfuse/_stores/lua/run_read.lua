--[[
run_read.lua: read a run's state, changing nothing.

KEYS[1]  the run's state string  <prefix>:{run:<hash>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME

Returns the run's nine doubles as %.17g text (_budget.lua), or '' when there is no such run.
--]]

local r = load_run(KEYS[1], clock(ARGV[1]))
if r == nil then return '' end
return run_numbers(r)
