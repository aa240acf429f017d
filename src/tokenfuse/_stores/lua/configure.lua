--[[
configure.lua: set or clear the key's live overrides, read by every process with its next
decision (ops.Configure).

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  limit_override /min: '' = leave as is, -1 = none (the code's policy applies)
ARGV[4]  capacity_override:   same convention
ARGV[5]  rate_override /s:    same convention

A key without the state an override belongs to gets a new one (first seen now; a bucket that
starts full). Announces the change (PUBLISH, see _lib.lua). Returns nothing.
--]]

local now = clock(ARGV[1])
local s = load_state(KEYS[1])
local v = nil
if ARGV[3] ~= '' then
  v = load_velocity(s) or new_velocity(now)
  v[LIMIT_OVERRIDE] = tonumber(ARGV[3])
end
local b = nil
if ARGV[4] ~= '' or ARGV[5] ~= '' then
  b = load_bucket(s) or new_bucket(FULL, now)
  if ARGV[4] ~= '' then b.capacity_override = tonumber(ARGV[4]) end
  if ARGV[5] ~= '' then b.rate_override = tonumber(ARGV[5]) end
end
save(KEYS[1], ARGV[2], s, v, b)
announce(KEYS[1], 'u')
