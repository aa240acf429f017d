--[[
record_batch.lua: several records of one key, in order, at one now (ops.RecordBatch): the
usage of calls recorded off the caller's path, sent together. Each amount goes through
record() exactly as record.lua's one does; the state is read and written once.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  velocity policy, as in record.lua
ARGV[4..] the amounts, in order

Calls TIME (unless ARGV[1] is given), GET and SET ... PX; a trip is announced (PUBLISH, see
_lib.lua). Returns the verdict of the first record that tripped, or else of the last one, as
in record.lua.
--]]

local now = clock(ARGV[1])
local s = load_state(KEYS[1])
local v = load_velocity(s) or new_velocity(now)
local before = v.open_until
local p = velocity_params(ARGV[3])
local verdict, tripped = nil, nil
for i = 4, #ARGV do
  local _, text = record(v, tonumber(ARGV[i]), now, p)
  if tripped == nil and string.sub(text, 1, 3) == '0 1' then tripped = text end
  verdict = text
end
save(KEYS[1], ARGV[2], s, v, nil)
announce_trip(KEYS[1], v, before, now)
return tripped or verdict
