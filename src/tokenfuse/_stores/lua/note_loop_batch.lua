--[[
note_loop_batch.lua: several notes of one identity's calls, in order, at one now
(ops.NoteLoopBatch): the notes of calls recorded off the caller's path, sent together. Each
goes through note_loop() exactly as note_loop.lua's one does; the calls are read and written
once.

KEYS[1]  the identity's loop string  <prefix>:loops:{<key>}
ARGV[1]  now: epoch seconds as a decimal string; '' = the server's TIME
ARGV[2]  ttl of the string, milliseconds
ARGV[3]  loop policy, as in check_loops.lua
ARGV[4]  the notes, in order, NOTE_SIZE bytes each (one argument, however many notes, as
         record_batch.lua's amounts): the fingerprint (16 characters), the outcome ('1'
         failed, '0' succeeded, '-' not counted), '1' to count a send first (else '0'), the
         status (a little-endian double), the error type (32 characters, padded with spaces)

Calls TIME (unless ARGV[1] is given), GET, and SET ... PX (DEL when no call is left); each
trip is announced (_lib.lua, "Announcements").

Returns one verdict per note, in order, each as check_loops.lua's, except '' for a note that
found nothing to say (allowed, nothing tripped or repeated, no failure counted): most of them.
--]]

local NOTE_SIZE = 58
local now = clock(ARGV[1])
local p = loop_params(ARGV[3])
local calls = prune_loops(load_loops(KEYS[1]), now, p)
local notes = ARGV[4]
local verdicts = {}
for at = 1, #notes, NOTE_SIZE do
  local outcome = string.sub(notes, at + 16, at + 16)
  local failed = nil
  if outcome ~= '-' then failed = outcome == '1' end
  local err = string.gsub(string.sub(notes, at + 26, at + NOTE_SIZE - 1), ' +$', '')
  local verdict = note_loop(calls, string.sub(notes, at, at + 15), failed,
    unpack_doubles('<d', notes, at + 18), err, now, p, string.sub(notes, at + 17, at + 17) == '1')
  if verdict == '1 0 0 0 0 0 0 0 0 -' then verdict = '' end
  verdicts[#verdicts + 1] = verdict
end
save_loops(KEYS[1], ARGV[2], calls, now, p)
return verdicts
