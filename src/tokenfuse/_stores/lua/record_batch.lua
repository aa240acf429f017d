--[[
record_batch.lua: several records of one key, in order, at one now (ops.RecordBatch): the
usage of calls recorded off the caller's path, sent together. Each amount goes through
record() exactly as record.lua's one does; the state is read and written once.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  velocity policy, as in record.lua
ARGV[4]  the amounts, in order: little-endian doubles, 8 bytes each (one argument, however
         many amounts: what a batch costs to send and to read is its records, not its
         arguments)

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; a trip is announced (PUBLISH, see
_lib.lua). Returns the verdict of the first record that tripped, or else of the last one, as
in record.lua; only that verdict is packed.
--]]

local now = clock(ARGV[1])
local s = load_state(KEYS[1])
local v = load_velocity(s) or new_velocity(now)
local before = v[OPEN_UNTIL]
local p = velocity_params(ARGV[3])
local amounts = ARGV[4]
local verdict, allowed, tripped, rate, limit, baseline = nil, 0, 0, 0.0, nil, nil
for at = 1, #amounts, 8 do
  allowed, tripped, rate, limit, baseline = record_step(v, unpack_doubles('<d', amounts, at),
    now, p)
  if tripped == 1 and verdict == nil then verdict = refusal(v, now, 1) end
end
if verdict == nil then
  if allowed == 1 then
    verdict = allowed_verdict(rate, limit, baseline)
  else
    verdict = refusal(v, now, 0)
  end
end
save(KEYS[1], ARGV[2], s, v, nil)
announce_trip(KEYS[1], v, before, now)
return verdict
