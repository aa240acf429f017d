--[[
status.lua: read the key's whole state, changing nothing.

The view itself (rate over the window, established baseline, bucket level) is computed by the
Python core from these numbers (velocity.snapshot, bucket.level), so it cannot drift from it.

KEYS[1]  velocity hash   <prefix>:{<key>}:v
KEYS[2]  bucket hash     <prefix>:{<key>}:b
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME

Returns {now, velocity state, bucket state}: each state as its numbers in the order of
_lib.lua followed by its overrides (-1 = none), space-separated %.17g; '' when the key has
no such state.
--]]

local function numbers(state, names)
  if state == nil then return '' end
  local out = {}
  for i, name in ipairs(names) do out[i] = fmt(state[name]) end
  return table.concat(out, ' ')
end

local now = clock(ARGV[1])
local v = load_velocity(KEYS[1])
local text = ''
if v ~= nil then
  local ring = {}
  for i = 1, SLOTS do
    ring[i] = fmt(v.amounts[i])
    ring[i + SLOTS] = fmt(v.largest[i])
  end
  text = numbers(v, {'first_seen', 'head', 'minute', 'minute_amount', 'pending_minute',
    'pending_amount', 'baseline', 'weight', 'samples', 'learned_at', 'open_until', 'strikes',
    'last_trip', 'trip_reason', 'trip_rate', 'trip_limit', 'trip_baseline'})
    .. ' ' .. table.concat(ring, ' ') .. ' ' .. fmt(v.limit_override)
end
local bucket = numbers(load_bucket(KEYS[2]), {'tokens', 'updated', 'use_minute', 'use_amount',
  'hot_since', 'alerted', 'capacity_override', 'rate_override'})
return {fmt(now), text, bucket}
