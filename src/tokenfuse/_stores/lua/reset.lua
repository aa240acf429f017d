--[[
reset.lua: close the key at once, forget its window and escalation (velocity.reset), and
fill its bucket (tokens = FULL). What the key learned, and its live overrides, stay.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  ttl of the string, milliseconds

Announces the reset (PUBLISH, see _lib.lua). Returns the number of blocks (velocity, bucket) the key held (0..2).
--]]

local s = load_state(KEYS[1])
local v = load_velocity(s)
if v ~= nil then reset_velocity(v) end
local b = load_bucket(s)
if b ~= nil then b.tokens = FULL end
save(KEYS[1], ARGV[1], s, v, b)
announce(KEYS[1], 'c')
return (v and 1 or 0) + (b and 1 or 0)
