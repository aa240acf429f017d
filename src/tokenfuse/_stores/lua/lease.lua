--[[
lease.lua: renew a process's lease of a bucket (ops.Lease, lease.grant): give back the unspent
tokens of the previous lease and record the amounts of the calls it admitted, decide this call
as admit.lua does, and if it is allowed take up to `want` more tokens for the new lease.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  cost taken from the bucket for this call
ARGV[4]  amount added to the velocity window for this call (0 = check the latch only)
ARGV[5]  want: tokens to take for the lease beyond the cost
ARGV[6]  give_back: the previous lease's unspent tokens
ARGV[7]  velocity policy as in record.lua, or '' for none
ARGV[8]  bucket policy as in admit.lua, or '' for none
ARGV[9..] the amounts of the calls the previous lease admitted, in order

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; a trip is announced (PUBLISH, see
_lib.lua).

Returns packed little-endian doubles (_lib.lua, "Verdicts"): the tokens granted beyond the
cost; the verdict of the first trip among the recorded amounts, all 9 fields (allowed = -1
when none tripped); then this call's admission, admit.lua's reply, to the end.
--]]

local now = clock(ARGV[1])
local cost = tonumber(ARGV[3])
local amount = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local vp = velocity_params(ARGV[7])
local bp = bucket_params(ARGV[8])
local s = load_state(KEYS[1])

local v = nil
if vp ~= nil then
  v = load_velocity(s)
  if v == nil and (amount > 0 or #ARGV >= 9) then v = new_velocity(now) end
end
local b = nil
if bp ~= nil then b = load_bucket(s) or new_bucket(bp.capacity, now) end

local before = v and v[OPEN_UNTIL]
local tripped = settle(v, b, tonumber(ARGV[6]), 9, now, vp, bp)
local allowed, latch, taken = admit(v, b, cost, amount, now, vp, bp)
local granted = 0.0
if allowed == 1 and bp ~= nil and b ~= nil and want > 0.0 then
  granted = take_more(b, want, now, bp)
  local capacity, rate = limits_of(b, bp)
  local near_limit = select(6, unpack_doubles(BUCKET_VERDICT, taken))
  taken = pack(BUCKET_VERDICT, 1, b.tokens, capacity, rate, 0, near_limit)
end
save(KEYS[1], ARGV[2], s, v, b)
announce_trip(KEYS[1], v, before, now)
tripped = tripped or pack(VERDICT_FORMAT, -1, 0, 0, 0, NAN, NAN, NAN, 0, NAN)
return pack('<d', granted) .. tripped .. admission_reply(allowed, latch, taken)
