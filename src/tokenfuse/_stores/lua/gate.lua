--[[
gate.lua: is the key open? (velocity.gate) Read-only: a refused call spends nothing.

KEYS[1]  the identity's state string  <prefix>:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME

Calls GET, then TIME only when the key has velocity state.

Returns '1' when the key is closed (or unknown), else the refusal
  '0 0 <reason code> <trip rate /min> <trip limit /min> <baseline /min> <multiple>
   <retry_after s>'
(numbers as %.17g, None as nan).
--]]

local v = load_velocity(load_state(KEYS[1]))
if v == nil then return '1' end
local ok, verdict = gate(v, clock(ARGV[1]))
if ok == 1 then return '1' end -- the common case: nothing for the client to parse
return verdict
