--[[
gate.lua: is the key open? (velocity.gate) Read-only: a refused call spends nothing.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME

Calls GET, then TIME only when the key has velocity state.

Returns ALLOWED (1.0 packed: nothing more to say) when the key is closed (or unknown), else
the refusal as 9 packed doubles, None as NaN (_lib.lua, "Verdicts"):
  0 0 <reason code> <trip rate /min> <trip limit /min> <baseline /min> <multiple>
  <retry_after s> <window s>
--]]

-- velocity.gate, reading only open_until (the 2nd double) unless the key is open.
local s = load_state(KEYS[1])
if not s or #s == B_SIZE then return ALLOWED end -- no velocity state
local now = clock(ARGV[1])
local open_until = select(2, unpack_doubles(OPEN_FORMAT, s))
if open_until > now then return refusal(load_velocity(s), now, 0) end
return ALLOWED -- the common case: nothing for the client to parse
