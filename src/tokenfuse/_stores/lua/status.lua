--[[
status.lua: read the key's whole state, changing nothing.

The view itself (rate over the window, established baseline, bucket level) is computed by the
Python core from these numbers (status.status_of), so it cannot drift from it.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME

Returns {now, velocity block, bucket block}: each block's doubles in their stored order (the
state, then its overrides, -1 = none; redis_codec.py's layout) as space-separated %.17g text,
so that clients with decode_responses=True work too; '' when the key has no such block.
--]]

local function numbers(count, ...) -- the first count values (struct.unpack adds one more)
  local values = {...}
  for i = 1, count do values[i] = fmt(values[i]) end
  return table.concat(values, ' ', 1, count)
end

local now = clock(ARGV[1])
local s = load_state(KEYS[1])
local velocity, bucket = '', ''
if s and #s ~= B_SIZE then velocity = numbers(88, unpack_doubles(V_FORMAT, s)) end
if s and #s ~= V_SIZE then bucket = numbers(8, unpack_doubles(B_FORMAT, s, #s - B_SIZE + 1)) end
return {fmt(now), velocity, bucket}
