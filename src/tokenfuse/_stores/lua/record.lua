--[[
record.lua: add an amount to the key's window and judge the new rate (velocity.record).
A trip opens the key; the verdict says so.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  the call: 3 little-endian doubles: now, epoch seconds (-1 = the server's TIME); ttl
         of the string, milliseconds; amount, in the policy's unit (tokens, calls, ...). One
         argument, not three: each costs the client an encoding (docs/design.md#state-layout)
ARGV[2]  velocity policy: 16 little-endian doubles: limit /min (-1 = None), spike_multiple,
         min_baseline /min, learning_period s, min_samples, cold_start_limit /min,
         cold_start_sustained /min, half_life s, sustained_multiple,
         sustained_baseline_multiple, early_threshold, ceiling_multiple, learn_clip,
         cooldown s, cooldown_max s, escalation_window s (-1 = None where None is allowed)

Calls TIME (unless the call gives now), GET and SET ... PX; the bucket block, if any, is
written back as it was. A trip is announced (PUBLISH, see _lib.lua).

Returns the verdict as packed little-endian doubles, None as NaN (_lib.lua, "Verdicts"):
allowed, 5 of them: 1 <rate /min> <limit /min> <baseline /min> <multiple>; refused, all 9:
0 <tripped> <reason code> <rate /min> <limit /min> <baseline /min> <multiple> <retry_after s>
<window s>.
--]]

local at, ttl, amount = unpack_doubles(RECORD_CALL, ARGV[1])
local now = clock(at)
local s = load_state(KEYS[1])
local v = load_velocity(s) or new_velocity(now)
local before = v[OPEN_UNTIL]
local _, verdict = record(v, amount, now, velocity_params(ARGV[2]))
save(KEYS[1], ttl_text(ttl), s, v, nil)
announce_trip(KEYS[1], v, before, now)
return verdict
