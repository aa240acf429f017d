--[[
note_loop.lua: after a call, count its send (if its check did not), then its failure, or end
its failures (loops.note); the failure that reaches the policy's count trips the call.

KEYS[1]  the identity's loop string  <prefix>:loops:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  the call's fingerprint (16 hex characters)
ARGV[4]  loop policy, as in check_loops.lua
ARGV[5]  '1' the call failed, '0' it succeeded, '' its outcome is not counted (a retry)
ARGV[6]  the HTTP status of the failure (0: none)
ARGV[7]  the failure's type: at most 32 characters, no spaces ('' when unknown)
ARGV[8]  '1': count the call as a send first (its check counted none); else not

Calls TIME (unless ARGV[1] is given), GET, and SET ... PX (DEL when no call is left): the
string lives an hour past its last call's end, at most the ttl.

A trip is announced (_lib.lua, "Announcements"): a marker and a PUBLISH.

Returns the verdict as check_loops.lua does.
--]]

local now = clock(ARGV[1])
local p = loop_params(ARGV[4])
local calls = prune_loops(load_loops(KEYS[1]), now, p)
local verdict = note_loop(calls, ARGV[3], note_outcome(ARGV[5]), tonumber(ARGV[6]),
  string.sub(ARGV[7], 1, LOOP_ERROR), now, p, ARGV[8] == '1')
save_loops(KEYS[1], ARGV[2], calls, now, p)
return verdict
