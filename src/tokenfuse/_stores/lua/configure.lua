--[[
configure.lua: set or clear the key's live overrides, read by every process with its next
decision (MemoryStore.configure).

KEYS[1]  velocity hash   <prefix>:{<key>}:v
KEYS[2]  bucket hash     <prefix>:{<key>}:b
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of both hashes, milliseconds
ARGV[3]  limit_override /min: '' = leave as is, -1 = none (the code's policy applies)
ARGV[4]  capacity_override:   same convention
ARGV[5]  rate_override /s:    same convention

A key without state gets a new one (first seen now; a bucket that starts full).
Returns nothing.
--]]

local now = clock(ARGV[1])
if ARGV[3] ~= '' then
  if load_velocity(KEYS[1]) == nil then save_velocity(KEYS[1], new_velocity(now)) end
  redis.call('HSET', KEYS[1], 'limit_override', ARGV[3])
end
if ARGV[4] ~= '' or ARGV[5] ~= '' then
  if load_bucket(KEYS[2]) == nil then save_bucket(KEYS[2], new_bucket(FULL, now)) end
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], 'capacity_override', ARGV[4]) end
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'rate_override', ARGV[5]) end
end
touch(ARGV[2])
