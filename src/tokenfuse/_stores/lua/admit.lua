--[[
admit.lua: decide one inbound call: latch, then bucket, then velocity (admission.admit).

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  the call: 4 little-endian doubles: now, epoch seconds (-1 = the server's TIME); ttl
         of the string, milliseconds; cost taken from the bucket; amount added to the velocity
         window (0 = check the latch only). One argument, as record.lua's
ARGV[2]  velocity policy as in record.lua, or '' for none
ARGV[3]  bucket policy: 4 little-endian doubles: rate /s, capacity, near_limit_fraction,
         near_limit_after s; or '' for none

Calls TIME (unless the call gives now), GET and SET ... PX; a block the call has no policy
for is written back as it was.

Returns packed little-endian doubles (_lib.lua, "Verdicts", admission_reply): allowed; the
bucket verdict, 'allowed remaining capacity <rate /s> <retry_after s> near_limit' (always 6);
then the velocity verdict as in record.lua or gate.lua (1, 5 or 9), to the end. A verdict
that is None has allowed = -1 (the velocity one is then NO_VERDICT alone).
--]]

local at, ttl, cost, amount = unpack_doubles(ADMIT_CALL, ARGV[1])
local now = clock(at)
local vp = velocity_params(ARGV[2])
local bp = bucket_params(ARGV[3])
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
save(KEYS[1], ttl_text(ttl), s, v, b)
announce_trip(KEYS[1], v, before, now)
return admission_reply(allowed, latch, taken)
