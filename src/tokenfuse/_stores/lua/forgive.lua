--[[
forgive.lua: the key's last trip was legitimate (velocity.forgive): close the key at once and
teach that the rate it tripped at is normal at that hour of day and the next.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  ttl of the string, milliseconds

Announces the key closed, as a reset does (PUBLISH, see _lib.lua). Returns 1 when the key has
velocity state, else 0 (nothing to forgive).
--]]

local s = load_state(KEYS[1])
local v = load_velocity(s)
if v == nil then return 0 end
forgive_velocity(v)
save(KEYS[1], ARGV[1], s, v, nil)
announce(KEYS[1], 'c')
return 1
