--[[
return_lease.lua: close a process's lease of a bucket (ops.ReturnLease, lease.settle): give
back its unspent tokens and record the amounts of the calls it admitted, in order.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  give_back: the lease's unspent tokens
ARGV[4]  velocity policy as in record.lua, or '' for none
ARGV[5]  bucket policy as in admit.lua, or '' for none
ARGV[6..] the amounts of the calls the lease admitted, in order

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; a trip is announced (PUBLISH, see
_lib.lua). Returns the verdict of the first trip among the amounts as in record.lua (9 packed
doubles), or NO_VERDICT (-1.0 packed) when none tripped.
--]]

local now = clock(ARGV[1])
local vp = velocity_params(ARGV[4])
local bp = bucket_params(ARGV[5])
local s = load_state(KEYS[1])

local v = nil
if vp ~= nil then
  v = load_velocity(s)
  if v == nil and #ARGV >= 6 then v = new_velocity(now) end
end
local b = nil
if bp ~= nil then b = load_bucket(s) or new_bucket(bp.capacity, now) end

local before = v and v[OPEN_UNTIL]
local tripped = settle(v, b, tonumber(ARGV[3]), 6, now, vp, bp)
save(KEYS[1], ARGV[2], s, v, b)
announce_trip(KEYS[1], v, before, now)
return tripped or NO_VERDICT
