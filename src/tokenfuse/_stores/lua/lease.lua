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

Returns admit.lua's reply (16 fields), then the tokens granted beyond the cost, then the
verdict of the first trip among the recorded amounts as in record.lua (9 fields; allowed = -1
when none tripped).
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
  taken = string.format('1 %.17g %.17g %.17g 0 %s', b.tokens, capacity, rate,
    string.sub(taken, -1))
end
save(KEYS[1], ARGV[2], s, v, b)
announce_trip(KEYS[1], v, before, now)
return string.format('%d %s %s %.17g %s', allowed, latch or '-1 0 0 0 nan nan nan 0 nan',
  taken or '-1 0 0 0 0 0', granted, tripped or '-1 0 0 0 nan nan nan 0 nan')
