--[[
reset.lua: close the key at once, forget its window and escalation (velocity.reset), and
fill its bucket (tokens = FULL). What the key learned, and its live overrides, stay.

KEYS[1]  velocity hash   <prefix>:{<key>}:v
KEYS[2]  bucket hash     <prefix>:{<key>}:b
ARGV[1]  ttl of both hashes, milliseconds

Returns the number of hashes that existed (0..2).
--]]

local found = 0
local v = load_velocity(KEYS[1])
if v ~= nil then
  reset_velocity(v)
  save_velocity(KEYS[1], v)
  found = found + 1
end
local b = load_bucket(KEYS[2])
if b ~= nil then
  b.tokens = FULL
  save_bucket(KEYS[2], b)
  found = found + 1
end
touch(ARGV[1])
return found
