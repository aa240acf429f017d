--[[
admit.lua: decide one inbound call: latch, then bucket, then velocity (admission.admit).

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  cost taken from the bucket
ARGV[4]  amount added to the velocity window (0 = check the latch only)
ARGV[5]  velocity policy as in record.lua, or '' for none
ARGV[6]  bucket policy: 4 little-endian doubles: rate /s, capacity, near_limit_fraction,
         near_limit_after s; or '' for none

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; a block the call has no policy
for is written back as it was.

Returns packed little-endian doubles (_lib.lua, "Verdicts", admission_reply): allowed; the
bucket verdict, 'allowed remaining capacity <rate /s> <retry_after s> near_limit' (always 6);
then the velocity verdict as in record.lua or gate.lua (1, 5 or 9), to the end. A verdict
that is None has allowed = -1 (the velocity one is then NO_VERDICT alone).
--]]

local now = clock(ARGV[1])
local cost = tonumber(ARGV[3])
local amount = tonumber(ARGV[4])
local vp = velocity_params(ARGV[5])
local bp = bucket_params(ARGV[6])
local s = load_state(KEYS[1])

local v = nil
if vp ~= nil then
  v = load_velocity(s)
  if v == nil and amount > 0 then v = new_velocity(now) end
end
local b = nil
if bp ~= nil then b = load_bucket(s) or new_bucket(bp.capacity, now) end

local before = v and v[OPEN_UNTIL]
local allowed, latch, taken = admit(v, b, cost, amount, now, vp, bp)
save(KEYS[1], ARGV[2], s, v, b)
announce_trip(KEYS[1], v, before, now)
return admission_reply(allowed, latch, taken)
