--[[
record.lua: add an amount to the key's window and judge the new rate (velocity.record).
A trip opens the key; the verdict says so.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  amount, in the policy's unit (tokens, calls, ...)
ARGV[4]  velocity policy: 16 little-endian doubles: limit /min (-1 = None), spike_multiple,
         min_baseline /min, learning_period s, min_samples, cold_start_limit /min,
         cold_start_sustained /min, half_life s, sustained_multiple,
         sustained_baseline_multiple, early_threshold, ceiling_multiple, learn_clip,
         cooldown s, cooldown_max s, escalation_window s (-1 = None where None is allowed)

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; the bucket block, if any, is
written back as it was. A trip is announced (PUBLISH, see _lib.lua).

Returns the verdict as packed little-endian doubles, None as NaN (_lib.lua, "Verdicts"):
allowed, 1; rate /min, limit /min, baseline /min, multiple when allowed; else all nine fields,
'0 tripped <reason code> <rate /min> <limit /min> <baseline /min> <multiple> <retry_after s>
<window s>'.
--]]

local now = clock(ARGV[1])
local s = load_state(KEYS[1])
local v = load_velocity(s) or new_velocity(now)
local before = v[OPEN_UNTIL]
local _, verdict = record(v, tonumber(ARGV[3]), now, velocity_params(ARGV[4]))
save(KEYS[1], ARGV[2], s, v, nil)
announce_trip(KEYS[1], v, before, now)
return verdict
