--[[
forget_loops.lua: forget one of the identity's calls, or all of them (loops.forget).

KEYS[1]  the identity's loop string  <prefix>:loops:{<key>}
ARGV[1]  ttl of the string, milliseconds
ARGV[2]  the call's fingerprint, or '' for every call

Announces what it forgot (_lib.lua, "Announcements") when it forgot any.

Returns the number of calls forgotten.
--]]

local calls = load_loops(KEYS[1])
local kept = {}
for _, c in ipairs(calls) do
  if ARGV[2] ~= '' and c.fingerprint ~= ARGV[2] then kept[#kept + 1] = c end
end
save_loops(KEYS[1], ARGV[1], kept)
if #kept < #calls then announce_loops_forgotten(KEYS[1], calls, ARGV[2]) end
return #calls - #kept
