--[[
check_loops.lua: before a call, is it refused as a loop? (loops.check) Counts a send, unless
ARGV[5] is '0'.

KEYS[1]  the identity's loop string  <prefix>:loops:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  the call's fingerprint (16 hex characters)
ARGV[4]  loop policy: 8 little-endian doubles: failures, failure_window s, cooldown s,
         repeats, repeat_window s, refuse_repeats (0/1), max_calls, cooldown_max s
ARGV[5]  '0': only "is this call refused?" (loops._peek): nothing counted, nothing written
         (the send is counted after the call, note_loop.lua's ARGV[8]); else count a send

Calls TIME (unless ARGV[1] is given), GET, and SET ... PX (DEL when no call is left): the
string lives an hour past its last call's end, at most the ttl. With ARGV[5] '0', GET only.

Returns the verdict 'allowed reason tripped repeated count window retry_after failures
status error' (reason: 0 none, 1 failure_loop, 2 repeat_loop; error '-' when none).
--]]

local now = clock(ARGV[1])
local p = loop_params(ARGV[4])
local calls = prune_loops(load_loops(KEYS[1]), now, p)
if ARGV[5] == '0' then return peek_loop(calls, ARGV[3], now, p) end
local verdict = check_loop(calls, ARGV[3], now, p)
save_loops(KEYS[1], ARGV[2], calls, now, p)
return verdict
