--[[
note_loop_batch.lua: several notes of one identity's calls, in order, at one now
(ops.NoteLoopBatch): the notes of calls recorded off the caller's path, sent together. Each
goes through note_loop() exactly as note_loop.lua's one does; the calls are read and written
once.

KEYS[1]  the identity's loop string  <prefix>:loops:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  loop policy, as in check_loops.lua
ARGV[4..] five per note, as note_loop.lua's ARGV[3], [5], [6], [7], [8]: fingerprint,
         outcome ('1', '0', ''), status, error type, count a send ('1'/'0')

Calls TIME (unless ARGV[1] is given), GET, and SET ... PX (DEL when no call is left); each
trip is announced (_lib.lua, "Announcements").

Returns one verdict per note, in order, each as check_loops.lua's.
--]]

local now = clock(ARGV[1])
local p = loop_params(ARGV[3])
local calls = prune_loops(load_loops(KEYS[1]), now, p)
local verdicts = {}
for at = 4, #ARGV, 5 do
  verdicts[#verdicts + 1] = note_loop(calls, ARGV[at], note_outcome(ARGV[at + 1]),
    tonumber(ARGV[at + 2]), string.sub(ARGV[at + 3], 1, LOOP_ERROR), now, p,
    ARGV[at + 4] == '1')
end
save_loops(KEYS[1], ARGV[2], calls, now, p)
return verdicts
