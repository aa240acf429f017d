--[[
_lib.lua: the policy core (tokenfuse/_core/velocity.py, bucket.py, admission.py) in Lua 5.1.

Prepended to every operation's script when it is loaded, so each script is one self-contained
chunk and no rule is written twice. Every function mirrors the Python function of the same
name with the same arithmetic in the same order: Lua numbers are IEEE doubles and exp, log
and pow come from the same libm, so the results are bit-identical to the core's (the
differential test reads the state back from Redis and compares it field by field).

Redis runs a script's whole chunk on every EVALSHA, and each function definition costs a
closure then, more for each outer local it captures; so the loader (redis_scripts.py) writes
the constants below into the code as literals (keep each one 'local NAME = <literal>' on its
own line) and keeps only the top-level definitions an operation uses. Keep every definition
a top-level 'local' statement.

State. Each identity is one string, <prefix>:{<key>}, written with its TTL by one SET ... PX:
a velocity block, then a bucket block, each only when the identity has that state, of
little-endian doubles in this order (the layout table is in redis_codec.py, the reasons for
it in docs/design.md#state-layout); load_velocity, load_bucket and save follow it:

  velocity block (88 doubles): first_seen, open_until, head, minute_head, baseline, calls,
    weight, samples, learned_at, discard_through, strikes, last_trip, trip_reason, trip_rate,
    trip_limit, trip_baseline, trip_window, early_level, early_at, early_since, early_amount,
    excused_slot, excused_amount, spread, amounts[0..12], largest[0..12], minute_amounts[0..10],
    minute_largest[0..10], minute_calls[0..10], profile[0..3], limit_override
  bucket block (8 doubles): tokens, updated, use_minute, use_amount, hot_since, alerted,
    capacity_override, rate_override

Decisions (record, record_batch, gate, admit, lease, return_lease) reply with packed
little-endian doubles, None as NaN: one struct.pack, exact, read by one struct.unpack in the
client (the layouts are under "Verdicts" below and in redis_codec.py). Formatting them as
%.17g text cost the server about 5.7 us of a record's 40 (glibc's exact printf), and the
client a split and a float() per field (docs/design.md#state-layout). The client reads every
script's reply undecoded, so clients with decode_responses=True work too. The other scripts
reply with text: numbers with %.17g (exact; Redis would truncate a Lua number to an integer),
None as 'nan'; so do the announcements.
--]]

local SLOT_SECONDS = 5.0
local SLOTS = 13
local WINDOW_SECONDS = 60.0
local MINUTE = 60.0
local LONG_WINDOW = 600.0
local LONG_SLOTS = 11
local HOUR = 3600.0
local PROFILE_WORDS = 4
local LN2 = 0.69314718055994529 -- math.log(2.0), to the last bit
local MANUAL = 1 -- trip reasons: velocity.REASON_CODES
local LOOP = 2
local COLD = 3
local SPARSE = 4
local EARLY = 5
local SUSTAINED = 6
local TOP = 7
local BUDGET = 8
local FULL = -1.0
local EPSILON = 1e-6 -- bucket.py: float resolution of timestamps near 1.7e9
-- struct formats: little-endian doubles; literals, as building them costs on every call
local V_FORMAT = '<dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd' -- 88: velocity block
local B_FORMAT = '<dddddddd' -- 8: bucket block
local OPEN_FORMAT = '<dd' -- 2: the velocity block up to open_until (the gate's)
local V_SIZE = 704 -- bytes of the velocity block
local B_SIZE = 64 -- bytes of the bucket block
local V_DOUBLES = 88 -- doubles in the velocity block
local VB_FORMAT = '<dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd' -- 96: both blocks, in one pack
-- The velocity state v is the block's doubles in a flat list, as one unpack returns them
-- (load_velocity): its fields at these indices, each ring's values right after its index
-- (v[AMOUNTS + 1] .. v[AMOUNTS + SLOTS] is Python's amounts[0..12]). A decision unpacks and
-- packs the block once and builds no table per field or ring: those cost a record more than
-- its rules did (docs/design.md#state-layout).
local FIRST_SEEN = 1
local OPEN_UNTIL = 2
local HEAD = 3
local MINUTE_HEAD = 4
local BASELINE = 5
local CALLS = 6
local WEIGHT = 7
local SAMPLES = 8
local LEARNED_AT = 9
local DISCARD_THROUGH = 10
local STRIKES = 11
local LAST_TRIP = 12
local TRIP_REASON = 13
local TRIP_RATE = 14
local TRIP_LIMIT = 15
local TRIP_BASELINE = 16
local TRIP_WINDOW = 17
local EARLY_LEVEL = 18
local EARLY_AT = 19
local EARLY_SINCE = 20
local EARLY_AMOUNT = 21
local EXCUSED_SLOT = 22
local EXCUSED_AMOUNT = 23
local SPREAD = 24
local AMOUNTS = 24 -- 13 (SLOTS)
local LARGEST = 37 -- 13
local MINUTE_AMOUNTS = 50 -- 11 (LONG_SLOTS)
local MINUTE_LARGEST = 61 -- 11
local MINUTE_CALLS = 72 -- 11
local PROFILE = 83 -- 4 (PROFILE_WORDS)
local LIMIT_OVERRIDE = 88
local VP_FORMAT = '<dddddddddddddddddd' -- 18: velocity policy
local BP_FORMAT = '<dddd' -- 4: bucket policy
local RECORD_CALL = '<ddd' -- a record's call: now, ttl ms, amount
local ADMIT_CALL = '<dddd' -- an admission's call: now, ttl ms, cost, amount

-- The math functions the rules call, as locals: a global is looked up in the environment at
-- every use (a function library's through its metatable: some 20 ns a call), a local is at
-- hand. (A function library binds them at its first call: math is out of reach at load;
-- the EVALSHA scripts call math's own instead: redis_scripts._global_math.)
local math_floor, math_ceil, math_max, math_min, math_exp =
  math.floor, math.ceil, math.max, math.min, math.exp

-- ---------------------------------------------------------------------------------------------
-- Plumbing: clock, doubles, replies

-- now: epoch seconds, as ARGV's text or a packed call's double; '' or -1: the server's TIME.
local function clock(arg)
  if arg ~= '' and arg ~= -1 then return tonumber(arg) end
  -- Redis < 5 needs effects replication before a write that follows TIME; a no-op since 7.
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local pack, unpack_doubles -- struct.pack and struct.unpack, or the same in plain Lua
if struct then
  pack = struct.pack
  unpack_doubles = struct.unpack -- (format, s, at): one more value (the next position) too
else
  -- fakeredis has no struct library: the same bytes from plain Lua (slow, but exact).
  local function double_bytes(x)
    local sign = 0
    if x < 0 or (x == 0 and 1 / x < 0) then
      sign = 128
      x = -x
    end
    local exponent, mantissa = 0, 0
    if x ~= x then -- NaN (None in a verdict)
      exponent, mantissa, sign = 2047, 2 ^ 51, 0
    elseif x == math.huge then
      exponent = 2047
    elseif x > 0 then
      local m, e = math.frexp(x) -- x = m * 2^e, 0.5 <= m < 1
      exponent = e + 1022
      if exponent > 0 then
        mantissa = (m * 2 - 1) * 2 ^ 52
      else -- subnormal
        mantissa = m * 2 ^ (52 + exponent)
        exponent = 0
      end
    end
    local bytes = {}
    for i = 1, 6 do
      bytes[i] = mantissa % 256
      mantissa = math_floor(mantissa / 256)
    end
    bytes[7] = (exponent % 16) * 16 + mantissa
    bytes[8] = sign + math_floor(exponent / 16)
    return string.char(unpack(bytes))
  end
  local NAN_DOUBLE = 0 / 0
  local function bytes_double(s, at)
    local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, at, at + 7)
    local sign = 1
    if b8 >= 128 then sign = -1 end
    local exponent = (b8 % 128) * 16 + math_floor(b7 / 16)
    local mantissa = (((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 65536
      + b2 * 256 + b1
    if exponent == 0 then return sign * math.ldexp(mantissa, -1074) end
    if exponent == 2047 then -- a mantissa makes it NaN (None in a verdict), else infinity
      if mantissa ~= 0 then return NAN_DOUBLE end
      return sign * math.huge
    end
    return sign * math.ldexp(mantissa + 2 ^ 52, exponent - 1075)
  end
  pack = function(format, ...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = double_bytes((select(i, ...))) end
    return table.concat(parts)
  end
  unpack_doubles = function(format, s, at)
    local values = {}
    at = (at or 1) - 8
    for i = 1, #format - 1 do values[i] = bytes_double(s, at + i * 8) end
    return unpack(values)
  end
end

local function fmt(x) return string.format('%.17g', x) end

local function opt(x) -- None travels as 'nan': nil, or NaN as in a verdict
  if x == nil or x ~= x then return 'nan' end
  return fmt(x)
end

-- ---------------------------------------------------------------------------------------------
-- Policies: a binary argument, '' when the operation has none. -1 stands for None.

-- A policy argument decoded once. A function library's locals outlive its calls, so each kind
-- of policy keeps the tables it decoded, by the argument's bytes, and a decision whose policy
-- was seen before reuses that table (the rules only read it) instead of building it again:
-- 9,000 of a record's 141,000 server instructions, 11,000 of an admission's 183,000
-- (benchmarks/script_instructions.py). A script's locals die with its call, so as an EVALSHA
-- script, the fallback, each call pays the memo's making instead (5,000 and 9,000 more). At
-- most MEMO_SIZE policies of a kind are kept; one more starts afresh.
local MEMO_SIZE = 64
local function memo(decode)
  local known, count = {}, 0
  return function(arg)
    local found = known[arg]
    if found ~= nil then return found end
    found = decode(arg)
    if found ~= nil then
      if count >= MEMO_SIZE then known, count = {}, 0 end
      known[arg], count = found, count + 1
    end
    return found
  end
end

local velocity_params = memo(function(arg)
  if arg == '' then return nil end
  local limit, spike, min_baseline, learning, samples, cold, cold_sustained, half_life,
    sustained, sustained_baseline, early, ceiling, clip, cooldown, cooldown_max, escalation,
    rms_share, cold_samples = unpack_doubles(VP_FORMAT, arg)
  if limit < 0 then limit = nil end
  if cold < 0 then cold = nil end
  if cold_sustained < 0 then cold_sustained = nil end
  if early < 0 then early = nil end
  if ceiling < 0 then ceiling = nil end
  if rms_share < 0 then rms_share = nil end
  return {
    limit = limit, spike_multiple = spike, min_baseline = min_baseline,
    learning_period = learning, min_samples = samples, cold_start_limit = cold,
    cold_start_sustained = cold_sustained, half_life = half_life,
    sustained_multiple = sustained, sustained_baseline_multiple = sustained_baseline,
    early_threshold = early, ceiling_multiple = ceiling, learn_clip = clip,
    cooldown = cooldown, cooldown_max = cooldown_max, escalation_window = escalation,
    rms_share = rms_share, cold_start_samples = cold_samples,
  }
end)

local bucket_params = memo(function(arg)
  if arg == '' then return nil end
  local rate, capacity, fraction, after = unpack_doubles(BP_FORMAT, arg)
  return {rate = rate, capacity = capacity, near_limit_fraction = fraction,
    near_limit_after = after}
end)

-- A decision's TTL (ms) as SET's text. Redis formats a number argument with glibc's exact
-- %.17g, some 2,000 instructions a call; the same text, made once per TTL.
local ttl_text = memo(fmt)

-- ---------------------------------------------------------------------------------------------
-- State (VelocityState, BucketState) <-> the identity's string

-- The states this library wrote, by the string it wrote: the velocity list and the bucket
-- table packed into it. A decision that GETs back the string the last one wrote (Lua strings
-- are interned: the same bytes are the same string, one table lookup) takes those instead of
-- unpacking it: 14,000 of a record's 130,000 server instructions, and the garbage. An entry is
-- taken out when used, so a table is never shared and one changed by a call that fails is
-- never found again; save() puts the changed tables back under the new string. Only a
-- function library keeps them between calls (as the policies'); at most MEMO_SIZE strings.
local written_v, written_b, written_count = {}, {}, 0

local function remember(blob, v, b)
  if written_count >= MEMO_SIZE then written_v, written_b, written_count = {}, {}, 0 end
  written_v[blob], written_b[blob], written_count = v, b, written_count + 1
end

-- The identity's string, or false when it has no state yet.
local function load_state(key)
  local s = redis.call('GET', key)
  if s and #s ~= V_SIZE and #s ~= B_SIZE and #s ~= V_SIZE + B_SIZE then
    error('tokenfuse: ' .. key .. ' holds no tokenfuse state')
  end
  return s
end

-- VelocityState(first_seen=now), as a flat list (v[OPEN_UNTIL] ...: see the indices above).
local function new_velocity(now)
  local v = {now, 0.0, -1, -1, 0.0, 0.0, 0.0, 0, 0.0, -1, 0, 0.0, 0, 0.0, 0.0, -1.0, 0.0, 0.0,
    0.0, 0.0, 0.0, -1, 0.0, 0.0} -- first_seen .. spread
  for i = AMOUNTS + 1, PROFILE + PROFILE_WORDS do v[i] = 0.0 end -- the rings
  v[LIMIT_OVERRIDE] = -1.0
  return v
end

-- The velocity state in string s, or nil.
local function load_velocity(s)
  if not s or #s == B_SIZE then return nil end
  local v = written_v[s]
  if v ~= nil then
    written_v[s] = nil
    return v
  end
  return {unpack_doubles(V_FORMAT, s)} -- (struct's next position lands past the block: unused)
end

local function new_bucket(tokens, now)
  return {tokens = tokens, updated = now, use_minute = -1, use_amount = 0.0, hot_since = -1,
    alerted = 0, capacity_override = -1.0, rate_override = -1.0}
end

-- The bucket state in string s, or nil.
local function load_bucket(s)
  if not s or #s == V_SIZE then return nil end
  local b = written_b[s]
  if b ~= nil then
    written_b[s] = nil
    return b
  end
  local tokens, updated, use_minute, use_amount, hot_since, alerted, capacity, rate =
    unpack_doubles(B_FORMAT, s, #s - B_SIZE + 1)
  return {tokens = tokens, updated = updated, use_minute = use_minute, use_amount = use_amount,
    hot_since = hot_since, alerted = alerted, capacity_override = capacity,
    rate_override = rate}
end

-- Write the identity's string with its TTL (ttl ms) in one SET: the velocity block of v, or
-- the one in s as it was; then the bucket block of b, or the one in s. Every operation that
-- writes refreshes the TTL, changed or not: an identity in use never expires, an idle one
-- disappears after ttl (the MemoryStore's touch). With a velocity list, both blocks are one
-- pack of v with the bucket's doubles after it (v[89..96], unread by the rules): each Lua
-- string costs a pass over its bytes (Redis's Lua hashes them all), and a block packed then
-- joined to the other makes three.
local function save(key, ttl, s, v, b)
  local blob = ''
  if v and (b or (s and #s ~= V_SIZE)) then
    local at = V_DOUBLES
    if b then
      v[at + 1], v[at + 2], v[at + 3], v[at + 4] = b.tokens, b.updated, b.use_minute,
        b.use_amount
      v[at + 5], v[at + 6], v[at + 7], v[at + 8] = b.hot_since, b.alerted,
        b.capacity_override, b.rate_override
    else -- the bucket block in s, as it was
      v[at + 1], v[at + 2], v[at + 3], v[at + 4], v[at + 5], v[at + 6], v[at + 7], v[at + 8] =
        unpack_doubles(B_FORMAT, s, #s - B_SIZE + 1)
    end
    blob = pack(VB_FORMAT, unpack(v, 1, V_DOUBLES + 8))
  elseif v then
    blob = pack(V_FORMAT, unpack(v, 1, V_DOUBLES))
  else
    if s and #s ~= B_SIZE then blob = string.sub(s, 1, V_SIZE) end
    if b then
      blob = blob .. pack(B_FORMAT, b.tokens, b.updated, b.use_minute, b.use_amount,
        b.hot_since, b.alerted, b.capacity_override, b.rate_override)
    elseif s and #s ~= V_SIZE then
      blob = blob .. string.sub(s, -B_SIZE)
    end
  end
  if blob ~= '' then
    redis.call('SET', key, blob, 'PX', ttl)
    remember(blob, v, b)
  end
end

-- ---------------------------------------------------------------------------------------------
-- Velocity (velocity.py)

local function advance(v, now)
  local slot = math_floor(now / SLOT_SECONDS)
  local head = v[HEAD]
  if slot > head then
    for index = math_max(head + 1, slot - SLOTS + 1), slot do
      local i = index % SLOTS + 1
      v[AMOUNTS + i] = 0.0
      v[LARGEST + i] = 0.0
    end
    v[HEAD] = slot
  end
  return v[HEAD] -- a clock that stepped back writes into the newest slot
end

-- The ring of count values after index ring of v, summed over its sliding window.
local function sliding_sum(v, ring, count, head, now, seconds)
  local oldest = (head + 1) % count + 1
  local elapsed = math_min(math_max((now - head * seconds) / seconds, 0.0), 1.0)
  local total = 0.0 -- left to right, as the core adds
  for i = ring + 1, ring + count do total = total + v[i] end
  return total - v[ring + oldest] * elapsed
end

local function window(v, now)
  return sliding_sum(v, AMOUNTS, SLOTS, v[HEAD], now, SLOT_SECONDS),
    math_max(unpack(v, LARGEST + 1, LARGEST + SLOTS))
end

local function long_rate(v, now)
  return sliding_sum(v, MINUTE_AMOUNTS, LONG_SLOTS, v[MINUTE_HEAD], now, MINUTE) *
    (MINUTE / LONG_WINDOW)
end

local function largest_slot(v)
  local best, ring = -1.0, 0
  for index = 0, SLOTS - 1 do
    if v[LARGEST + index + 1] > best then
      best = v[LARGEST + index + 1]
      ring = index
    end
  end
  return v[HEAD] - (v[HEAD] - ring) % SLOTS
end

local function learn(v, amount, calls, at, p)
  if v[SAMPLES] >= p.min_samples then
    amount = math_min(amount, p.learn_clip * v[BASELINE])
    calls = math_min(calls, p.learn_clip * v[CALLS])
  end
  if v[WEIGHT] > 0.0 then
    local decay = math_exp(-(at - v[LEARNED_AT]) * LN2 / p.half_life)
    v[WEIGHT] = v[WEIGHT] * decay + 1.0
  else
    v[WEIGHT] = 1.0
  end
  v[BASELINE] = v[BASELINE] + (amount - v[BASELINE]) / v[WEIGHT]
  v[CALLS] = v[CALLS] + (calls - v[CALLS]) / v[WEIGHT]
  v[SPREAD] = v[SPREAD] + (amount * amount - v[SPREAD]) / v[WEIGHT]
  v[SAMPLES] = v[SAMPLES] + 1
  v[LEARNED_AT] = at
end

local function roll_minutes(v, now, p)
  local minute = math_floor(now / MINUTE)
  local head = v[MINUTE_HEAD]
  if minute <= head then return end
  for index = math_max(head - LONG_SLOTS + 1, 0), math_min(head, minute - LONG_SLOTS) do
    local ring = index % LONG_SLOTS + 1
    local amount = v[MINUTE_AMOUNTS + ring]
    if amount > 0.0 and index > v[DISCARD_THROUGH] then
      learn(v, amount, v[MINUTE_CALLS + ring], (index + 1) * MINUTE, p)
    end
    v[MINUTE_AMOUNTS + ring] = 0.0
    v[MINUTE_LARGEST + ring] = 0.0
    v[MINUTE_CALLS + ring] = 0.0
  end
  v[MINUTE_HEAD] = minute
end

local function established(v, now, p)
  return now - v[FIRST_SEEN] >= p.learning_period and v[SAMPLES] >= p.min_samples
end

local function average(v, now, p)
  local age = now - v[FIRST_SEEN]
  if v[WEIGHT] <= 0.0 or age <= 0.0 then return 0.0 end
  local decay = math_exp(-(now - v[LEARNED_AT]) * LN2 / p.half_life)
  local minutes = p.half_life / (MINUTE * LN2) * (1.0 - math_exp(-age * LN2 / p.half_life))
  return v[BASELINE] * v[WEIGHT] * decay / minutes
end

local function typical_peak(v, p)
  if p.rms_share == nil then return 0.0 end
  return p.rms_share * math.sqrt(v[SPREAD])
end

local function allowance(v, now)
  local hour = math_floor(now / HOUR) % 24
  local word = v[PROFILE + math_floor(hour / 6) + 1]
  if word == 0.0 then return 0.0 end
  local code = math_floor(word / 2.0 ^ (8 * (hour % 6))) % 256
  if code == 0 then return 0.0 end
  return 2.0 ^ (code / 8.0)
end

local function teach(v, hour, rate)
  local code = math_min(math_max(math_ceil(8.0 * math.log(rate) / LN2), 1.0), 255.0)
  local place = 2.0 ^ (8 * (hour % 6))
  local at = PROFILE + math_floor(hour / 6) + 1
  local word = v[at]
  local old = math_floor(word / place) % 256
  if code > old then v[at] = word + (code - old) * place end
end

local function ceiling_of(v, p)
  if v[LIMIT_OVERRIDE] >= 0.0 then return v[LIMIT_OVERRIDE] end
  return p.limit
end

local function feed_early(v, amount, now, normal, p)
  local pace = p.spike_multiple * v[CALLS] * (normal / v[BASELINE]) / MINUTE
  local level = math_max(v[EARLY_LEVEL] - pace * math_max(now - v[EARLY_AT], 0.0), 0.0)
  if level == 0.0 then
    v[EARLY_SINCE] = now
    v[EARLY_AMOUNT] = 0.0
  end
  v[EARLY_LEVEL] = level + math_min(amount * v[CALLS] / v[BASELINE], 1.0)
  v[EARLY_AMOUNT] = v[EARLY_AMOUNT] + amount
  v[EARLY_AT] = now
end

-- (rate, span) when the excused large call and this one run at the threshold, else nil
local function sparse(v, largest, threshold)
  local slot = largest_slot(v)
  if slot == v[EXCUSED_SLOT] and largest == v[EXCUSED_AMOUNT] then return nil end
  local before, at = v[EXCUSED_AMOUNT], v[EXCUSED_SLOT]
  v[EXCUSED_SLOT] = slot
  v[EXCUSED_AMOUNT] = largest
  if at < 0 then return nil end
  local span = math_max((slot - at) * SLOT_SECONDS, WINDOW_SECONDS)
  local rate = (before + largest) * (WINDOW_SECONDS / span)
  if rate >= threshold then return rate, span end
  return nil
end

-- Each rule returns reason (0: none), rate, limit, baseline, window, as velocity._Finding.
local function established_rules(v, amount, rate, largest, normal, now, p)
  local threshold = p.spike_multiple * normal
  if rate >= threshold then
    if rate - largest >= threshold then return LOOP, rate, threshold, normal, WINDOW_SECONDS end
    local pair, span = sparse(v, largest, threshold)
    if pair ~= nil then return SPARSE, pair, threshold, normal, span end
  end
  if p.early_threshold ~= nil and v[CALLS] > 0.0 then
    feed_early(v, amount, now, normal, p)
    if v[EARLY_LEVEL] >= p.early_threshold then
      local span = math_max(now - v[EARLY_SINCE], 1.0)
      return EARLY, v[EARLY_AMOUNT] * (WINDOW_SECONDS / span), threshold, normal, span
    end
  end
  local avg = average(v, now, p)
  local sustained = math_max(p.sustained_multiple * avg, p.sustained_baseline_multiple * normal)
  local long = long_rate(v, now)
  local largest_minute = math_max(unpack(v, MINUTE_LARGEST + 1, MINUTE_LARGEST + LONG_SLOTS))
  if long - largest_minute * (MINUTE / LONG_WINDOW) >= sustained then
    return SUSTAINED, long, sustained, avg, LONG_WINDOW
  end
  local floor = p.cold_start_limit
  if floor ~= nil and p.ceiling_multiple ~= nil and v[LIMIT_OVERRIDE] < 0.0 then
    local top = math_max(p.ceiling_multiple * normal, floor)
    if rate > top then return TOP, rate, top, normal, WINDOW_SECONDS end
  end
  return 0, rate, threshold, normal, WINDOW_SECONDS
end

-- reason (0: none), rate, limit, window
local function cold_start_rules(v, rate, largest, normal, now, p)
  local floor = p.cold_start_limit
  local spike = nil
  if floor ~= nil then
    spike = math_max(floor, p.spike_multiple * normal)
    if rate - largest > spike then return COLD, rate, spike, WINDOW_SECONDS end
    local top = floor
    if p.ceiling_multiple ~= nil then top = math_max(floor, p.ceiling_multiple * normal) end
    if p.cold_start_sustained ~= nil then
      top = math_max(top, p.cold_start_sustained * (LONG_WINDOW / MINUTE))
    end
    if rate > top then return COLD, rate, top, WINDOW_SECONDS end
  end
  local budget = p.cold_start_sustained
  if budget ~= nil then
    budget = math_max(budget, p.sustained_baseline_multiple * normal)
    local long = long_rate(v, now)
    local largest_minute = math_max(unpack(v, MINUTE_LARGEST + 1, MINUTE_LARGEST + LONG_SLOTS))
    if long - largest_minute * (MINUTE / LONG_WINDOW) > budget then
      return BUDGET, long, budget, LONG_WINDOW
    end
  end
  return 0, rate, spike, WINDOW_SECONDS
end

local function judge(v, amount, now, p)
  local rate, largest = window(v, now)
  local baseline = nil
  if established(v, now, p) then baseline = v[BASELINE] end
  local ceiling = ceiling_of(v, p)
  if ceiling ~= nil and rate > ceiling then
    return MANUAL, rate, ceiling, baseline, WINDOW_SECONDS
  end
  local allowed = allowance(v, now)
  if baseline ~= nil and baseline >= p.min_baseline then
    local normal = math_max(baseline, allowed, typical_peak(v, p))
    return established_rules(v, amount, rate, largest, normal, now, p)
  end
  if v[LIMIT_OVERRIDE] >= 0.0 then return 0, rate, ceiling, baseline, WINDOW_SECONDS end
  local shown = 0.0
  if v[SAMPLES] >= p.cold_start_samples then shown = math_max(v[BASELINE], typical_peak(v, p)) end
  local reason, r, limit, span = cold_start_rules(v, rate, largest, math_max(shown, allowed),
    now, p)
  if reason == 0 and ceiling ~= nil then limit = ceiling end
  return reason, r, limit, baseline, span
end

local function trip(v, reason, rate, limit, baseline, span, now, p)
  local recent = v[STRIKES] > 0 and now - v[LAST_TRIP] <= p.escalation_window
  if recent then v[STRIKES] = v[STRIKES] + 1 else v[STRIKES] = 1 end
  local cooldown = math_min(p.cooldown * 2.0 ^ (v[STRIKES] - 1), p.cooldown_max)
  v[OPEN_UNTIL] = now + cooldown
  v[LAST_TRIP] = now
  v[TRIP_REASON] = reason
  v[TRIP_RATE] = rate
  if limit == nil then v[TRIP_LIMIT] = 0.0 else v[TRIP_LIMIT] = limit end
  if baseline == nil then v[TRIP_BASELINE] = -1.0 else v[TRIP_BASELINE] = baseline end
  v[TRIP_WINDOW] = span
  v[EARLY_LEVEL] = 0.0
  v[DISCARD_THROUGH] = math_max(v[DISCARD_THROUGH], math_floor(v[OPEN_UNTIL] / MINUTE))
end

-- Verdicts: packed little-endian doubles, None as NaN (redis_codec.py reads them). A velocity
-- verdict starts with allowed (1, 0, or -1: no verdict) and its length says what follows:
--   1 double   nothing more: ALLOWED (VelocityVerdict(allowed=True)) or NO_VERDICT
--   5 doubles  an allowed record: 1 rate limit baseline multiple (allowed_verdict)
--   9 doubles  every field: allowed tripped reason rate limit baseline multiple retry_after
--              window (refusal)
-- A bucket verdict is always 6 doubles: allowed remaining capacity rate retry_after
-- near_limit (allowed -1: no verdict).
local VERDICT_FORMAT = '<ddddddddd' -- 9: every field of a velocity verdict
local ALLOWED_FORMAT = '<ddddd' -- 5: an allowed record's
local BUCKET_VERDICT = '<dddddd' -- 6: a bucket verdict
local NAN = 0 / 0 -- None
local ALLOWED = '\0\0\0\0\0\0\240\63' -- 1.0, packed
local NO_VERDICT = '\0\0\0\0\0\0\240\191' -- -1.0, packed

local function refusal(v, now, tripped)
  local baseline = NAN
  if v[TRIP_BASELINE] >= 0.0 then baseline = v[TRIP_BASELINE] end
  local multiple = NAN
  local r = v[TRIP_REASON]
  local relative = r == LOOP or r == SPARSE or r == EARLY or r == SUSTAINED or r == TOP
  if baseline == baseline and baseline ~= 0.0 and relative then
    multiple = v[TRIP_RATE] / baseline
  end
  return pack(VERDICT_FORMAT, 0, tripped, r, v[TRIP_RATE], v[TRIP_LIMIT], baseline, multiple,
    v[OPEN_UNTIL] - now, v[TRIP_WINDOW])
end

-- (allowed 0/1, verdict)
local function gate(v, now)
  if v[OPEN_UNTIL] > now then return 0, refusal(v, now, 0) end
  return 1, ALLOWED
end

-- record() without its verdict: (allowed 0/1, tripped 0/1, rate, limit, baseline), the
-- last three for an allowed record only. A batch formats one verdict for many records.
local function record_step(v, amount, now, p)
  if now >= (v[MINUTE_HEAD] + 1) * MINUTE then roll_minutes(v, now, p) end
  local slot = advance(v, now) % SLOTS + 1
  v[AMOUNTS + slot] = v[AMOUNTS + slot] + amount
  v[LARGEST + slot] = math_max(v[LARGEST + slot], amount)
  local minute = v[MINUTE_HEAD] % LONG_SLOTS + 1
  v[MINUTE_AMOUNTS + minute] = v[MINUTE_AMOUNTS + minute] + amount
  v[MINUTE_LARGEST + minute] = math_max(v[MINUTE_LARGEST + minute], amount)
  v[MINUTE_CALLS + minute] = v[MINUTE_CALLS + minute] + 1.0
  if v[OPEN_UNTIL] > now then return 0, 0 end
  local reason, rate, limit, baseline, span = judge(v, amount, now, p)
  if reason ~= 0 and limit ~= nil then
    trip(v, reason, rate, limit, baseline, span, now, p)
    return 0, 1
  end
  return 1, 0, rate, limit, baseline
end

local function allowed_verdict(rate, limit, baseline)
  local multiple = nil
  if baseline ~= nil and baseline ~= 0.0 then multiple = rate / baseline end
  return pack(ALLOWED_FORMAT, 1, rate, limit or NAN, baseline or NAN, multiple or NAN)
end

local function record(v, amount, now, p)
  local allowed, tripped, rate, limit, baseline = record_step(v, amount, now, p)
  if allowed == 0 then return 0, refusal(v, now, tripped) end
  return 1, allowed_verdict(rate, limit, baseline)
end

local function clear_windows(v)
  v[HEAD] = -1
  v[MINUTE_HEAD] = -1
  for i = AMOUNTS + 1, MINUTE_CALLS + LONG_SLOTS do v[i] = 0.0 end -- every ring but profile
  v[EARLY_LEVEL] = 0.0
  v[EXCUSED_SLOT] = -1
  v[EXCUSED_AMOUNT] = 0.0
end

local function reset_velocity(v)
  v[OPEN_UNTIL] = 0.0
  v[STRIKES] = 0
  clear_windows(v)
end

local function forgive_velocity(v)
  if v[LAST_TRIP] > 0.0 and v[TRIP_RATE] > 0.0 and v[TRIP_REASON] ~= MANUAL then
    local hour = math_floor(v[LAST_TRIP] / HOUR) % 24
    teach(v, hour, v[TRIP_RATE])
    teach(v, (hour + 1) % 24, v[TRIP_RATE])
  end
  v[OPEN_UNTIL] = 0.0
  v[STRIKES] = 0
  v[EARLY_LEVEL] = 0.0
end

-- ---------------------------------------------------------------------------------------------
-- Bucket (bucket.py)

local function limits_of(b, p)
  local capacity = p.capacity
  if b.capacity_override > 0.0 then capacity = b.capacity_override end
  local rate = p.rate
  if b.rate_override > 0.0 then rate = b.rate_override end
  return capacity, rate
end

local function level(b, now, capacity, rate)
  if b.tokens < 0.0 then return capacity end
  local elapsed = math_max(now - b.updated, 0.0)
  return math_min(capacity, b.tokens + elapsed * rate)
end

local function track_use(b, cost, now, rate, p)
  local minute = math_floor(now / MINUTE)
  if minute > b.use_minute then
    local hot = b.use_amount >= p.near_limit_fraction * rate * MINUTE
    if not (hot and minute == b.use_minute + 1) then
      b.hot_since = -1
      b.alerted = 0
    end
    b.use_minute = minute
    b.use_amount = 0.0
  end
  b.use_amount = b.use_amount + cost
  if b.use_amount < p.near_limit_fraction * rate * MINUTE then return 0 end
  if b.hot_since < 0 then b.hot_since = b.use_minute end
  local long_enough = (b.use_minute - b.hot_since) * MINUTE >= p.near_limit_after
  if long_enough and b.alerted == 0 then
    b.alerted = 1
    return 1
  end
  return 0
end

-- (allowed 0/1, the bucket verdict)
local function consume(b, cost, now, p)
  local capacity, rate = limits_of(b, p)
  local tokens = level(b, now, capacity, rate)
  b.updated = math_max(now, b.updated)
  if tokens < cost - EPSILON then
    b.tokens = tokens
    return 0, pack(BUCKET_VERDICT, 0, tokens, capacity, rate, (cost - tokens) / rate, 0)
  end
  b.tokens = math_max(tokens - cost, 0.0)
  local near_limit = track_use(b, cost, now, rate, p)
  return 1, pack(BUCKET_VERDICT, 1, b.tokens, capacity, rate, 0, near_limit)
end

-- Leases (bucket.take_more, bucket.give_back): tokens taken ahead of the calls that spend them.
local function take_more(b, want, now, p)
  local taken = math_min(want, b.tokens)
  if taken <= 0.0 then return 0.0 end
  b.tokens = math_max(b.tokens - taken, 0.0)
  b.use_amount = b.use_amount + taken
  return taken
end

local function give_back(b, tokens, now, p)
  local capacity, rate = limits_of(b, p)
  local current = level(b, now, capacity, rate)
  b.updated = math_max(now, b.updated)
  b.tokens = math_min(capacity, current + tokens)
  if b.use_minute == math_floor(now / MINUTE) then
    b.use_amount = math_max(b.use_amount - tokens, 0.0)
  end
end

-- ---------------------------------------------------------------------------------------------
-- Admission (admission.py): latch, then bucket, then velocity.
-- Returns allowed (0/1) and the velocity and bucket verdicts, nil where the Python verdict is
-- None.

local function admit(v, b, cost, amount, now, vp, bp)
  local latch = nil
  local ok = 1
  if vp ~= nil and v ~= nil then
    ok, latch = gate(v, now)
    if ok == 0 then return 0, latch, nil end
  end
  local taken = nil
  if bp ~= nil and b ~= nil then
    ok, taken = consume(b, cost, now, bp)
    if ok == 0 then return 0, latch, taken end
  end
  if vp ~= nil and v ~= nil and amount > 0 then
    ok, latch = record(v, amount, now, vp)
    return ok, latch, taken
  end
  return 1, latch, taken
end

-- admit()'s reply (admit.lua): allowed, the bucket verdict (6 doubles, allowed -1 when None),
-- then the velocity verdict (1, 5 or 9 doubles; NO_VERDICT when None) to the end.
local function admission_reply(allowed, latch, taken)
  return pack('<d', allowed) .. (taken or pack(BUCKET_VERDICT, -1, 0, 0, 0, 0, 0))
    .. (latch or NO_VERDICT)
end

-- lease.settle: give back a lease's unspent tokens, then record the amounts of the calls it
-- admitted (ARGV[first..], in order). Returns the first trip's verdict, or nil.
local function settle(v, b, give, first, now, vp, bp)
  if bp ~= nil and b ~= nil and give > 0.0 then give_back(b, give, now, bp) end
  local verdict = nil
  if vp ~= nil and v ~= nil then
    for i = first, #ARGV do
      local _, tripped = record_step(v, tonumber(ARGV[i]), now, vp)
      if tripped == 1 and verdict == nil then verdict = refusal(v, now, 1) end
    end
  end
  return verdict
end

-- ---------------------------------------------------------------------------------------------
-- Announcements (open_keys.py): every process keeps a local view of the open keys, so its gate
-- needs no round trip. Only when a latch opens, is reset or forgiven, never on an ordinary decision, a
-- script
--   * PUBLISHes on '<prefix>:open-keys' (plain PUBLISH reaches every node of a Cluster), a
--     message ending with the key (a prefix may hold spaces):
--       'o <open_until> <the gate's refusal: 9 fields> <key>'   the key opened
--       'c <key>'                                               reset or forgiven (closed)
--       'u <key>'                                               its live overrides changed
--   * keeps a marker '<prefix>:open:{<key>}' = '<open_until> <refusal>' while the key is open
--     (PX: it expires with the latch; same hash tag, so same slot as the key): a process
--     that subscribes later finds the open keys with one SCAN.
-- The failure-loop breaker announces its trips on the same channel, keyed by the identity's
-- loop string '<prefix>:loops:{<key>}' (below, "The failure-loop breaker"):
--       'l <open_until> <fingerprint> <the check's refusal: 10 fields> <loops key>'   tripped
--       'f <fingerprint, or * for every call> <loops key>'                forgotten (forget_loops)
--   with a marker '<prefix>:open-loop:{<key>}:<fingerprint>' = '<open_until> <refusal>' that
--   expires with the cooldown (forget_loops deletes it).

local function split_key(key) -- '<prefix>:{<key>}' -> prefix, '{<key>}'
  local prefix, tagged = string.match(key, '^(.-):({.*)$')
  return prefix, tagged
end

local function announce(key, message)
  local prefix, tagged = split_key(key)
  if string.sub(message, 1, 1) == 'c' then redis.call('DEL', prefix .. ':open:' .. tagged) end
  redis.call('PUBLISH', prefix .. ':open-keys', message .. ' ' .. key)
end

-- Announce that v's latch opened during this script (it was open_until `before`), with the
-- gate's refusal as text: refusal()'s doubles unpacked again (a trip is rare; a text twin of
-- refusal() would cost every script that records one more closure per call).
local function announce_trip(key, v, before, now)
  if v == nil or v[OPEN_UNTIL] == before then return end
  local prefix, tagged = split_key(key)
  local fields = {unpack_doubles(VERDICT_FORMAT, refusal(v, now, 0))}
  for i = 1, 9 do fields[i] = opt(fields[i]) end
  local state = fmt(v[OPEN_UNTIL]) .. ' ' .. table.concat(fields, ' ', 1, 9)
  local ttl = math_max(math_ceil((v[OPEN_UNTIL] - now) * 1000), 1)
  redis.call('SET', prefix .. ':open:' .. tagged, state, 'PX', ttl)
  redis.call('PUBLISH', prefix .. ':open-keys', 'o ' .. state .. ' ' .. key)
end

-- ---------------------------------------------------------------------------------------------
-- The failure-loop breaker (loops.py): an identity's recent calls, one string of its own,
-- <prefix>:loops:{<key>} (same hash tag as the identity, so the same slot), of LOOP_SIZE bytes
-- a call, oldest first: the fingerprint (16 hex characters), the last error (32 characters,
-- padded with spaces), then LOOP_FORMAT's doubles: last_seen, sends, sends_since, failures,
-- failures_since, open_until, status, strikes, last_trip. No calls: no key.

local LOOP_FORMAT = '<ddddddddd' -- 9: one call's numbers
local LOOP_PRINT = 16 -- characters of a fingerprint
local LOOP_ERROR = 32 -- characters of an error type
local LOOP_SIZE = 120 -- bytes of one call
local LP_FORMAT = '<dddddddd' -- 8: loop policy
local ESCALATION_WINDOW = 3600.0 -- loops.ESCALATION_WINDOW
local MAX_STRIKES = 32.0
local LOOP_GRACE = 3600000 -- ms a loop string outlives its last call (clocks, simulations)
local FAILURE_LOOP = 1 -- refusal reasons: loops.LOOP_REASONS
local REPEAT_LOOP = 2

local loop_params = memo(function(arg)
  local failures, failure_window, cooldown, repeats, repeat_window, refuse, max_calls,
    cooldown_max = unpack_doubles(LP_FORMAT, arg)
  return {failures = failures, failure_window = failure_window, cooldown = cooldown,
    repeats = repeats, repeat_window = repeat_window, refuse_repeats = refuse == 1,
    max_calls = max_calls, cooldown_max = cooldown_max,
    keep = math_max(failure_window, repeat_window)}
end)

local function load_loops(key)
  local s = redis.call('GET', key)
  local calls = {}
  if not s then return calls end
  if #s % LOOP_SIZE ~= 0 then error('tokenfuse: ' .. key .. ' holds no tokenfuse loop state') end
  for at = 1, #s, LOOP_SIZE do
    local last_seen, sends, sends_since, failures, failures_since, open_until, status, strikes,
      last_trip = unpack_doubles(LOOP_FORMAT, s, at + LOOP_PRINT + LOOP_ERROR)
    calls[#calls + 1] = {
      fingerprint = string.sub(s, at, at + LOOP_PRINT - 1),
      error = (string.gsub(string.sub(s, at + LOOP_PRINT, at + LOOP_PRINT + LOOP_ERROR - 1),
        ' +$', '')),
      last_seen = last_seen, sends = sends, sends_since = sends_since, failures = failures,
      failures_since = failures_since, open_until = open_until, status = status,
      strikes = strikes, last_trip = last_trip,
    }
  end
  return calls
end

-- Write the calls (none: DEL). The string lives until its last call would be forgotten (p.keep
-- after it was last seen, or the end of its refusal) plus LOOP_GRACE ms, at most ttl ms: a
-- caller seen once costs its bytes for minutes, not for the identity's days. (Without p, as
-- for forget, the ttl.)
local function save_loops(key, ttl, calls, now, p)
  if #calls == 0 then
    redis.call('DEL', key)
    return
  end
  local parts = {}
  local last = now
  for i, c in ipairs(calls) do
    parts[i] = c.fingerprint .. c.error .. string.rep(' ', LOOP_ERROR - #c.error)
      .. pack(LOOP_FORMAT, c.last_seen, c.sends, c.sends_since, c.failures, c.failures_since,
        c.open_until, c.status, c.strikes, c.last_trip)
    if p then
      last = math_max(last, c.last_seen + p.keep, c.open_until, c.last_trip + ESCALATION_WINDOW)
    end
  end
  local px = tonumber(ttl)
  if p then px = math_min(px, math_ceil((last - now) * 1000) + LOOP_GRACE) end
  redis.call('SET', key, table.concat(parts), 'PX', math_max(px, 1))
end

local function prune_loops(calls, now, p)
  local kept = {}
  for _, c in ipairs(calls) do
    if now - c.last_seen <= p.keep or c.open_until > now
      or (c.last_trip > 0 and now - c.last_trip <= ESCALATION_WINDOW) then
      kept[#kept + 1] = c
    end
  end
  return kept
end

local function evict_loop(calls, now)
  local victim = -1
  for at, c in ipairs(calls) do
    if c.open_until <= now and (victim < 0 or c.last_seen < calls[victim].last_seen) then
      victim = at
    end
  end
  if victim < 0 then
    victim = 1
    for at, c in ipairs(calls) do
      if c.last_seen < calls[victim].last_seen then victim = at end
    end
  end
  table.remove(calls, victim)
end

local function loop_call(calls, fingerprint, now, p)
  for _, c in ipairs(calls) do
    if c.fingerprint == fingerprint then return c end
  end
  while #calls >= p.max_calls do evict_loop(calls, now) end
  local c = {fingerprint = fingerprint, error = '', last_seen = now, sends = 0.0,
    sends_since = 0.0, failures = 0.0, failures_since = 0.0, open_until = 0.0, status = 0.0,
    strikes = 0.0, last_trip = 0.0}
  calls[#calls + 1] = c
  return c
end

local function cooled(c, now)
  if 0 < c.open_until and c.open_until <= now then
    c.open_until = 0.0
    c.failures = 0.0
    c.failures_since = 0.0
  end
end

-- 'allowed reason tripped repeated count window retry_after failures status error' (the
-- error '-' when none): a LoopVerdict.
local function loop_verdict(allowed, reason, tripped, repeated, count, window, retry_after,
    failures, status, err)
  if err == '' then err = '-' end
  return string.format('%d %d %d %d %.17g %.17g %.17g %.17g %.17g %s', allowed, reason,
    tripped, repeated, count, window, retry_after, failures, status, err)
end

local function loop_refused(c, now, p, allowed, tripped)
  return loop_verdict(allowed, FAILURE_LOOP, tripped, 0, c.failures, p.failure_window,
    c.open_until - now, c.failures, c.status, c.error)
end

local function loop_marker(key, fingerprint) -- '<prefix>:loops:{<key>}' -> its trip's marker
  local prefix, tagged = string.match(key, '^(.-):loops:({.*)$')
  return prefix, prefix .. ':open-loop:' .. tagged .. ':' .. fingerprint
end

-- Announce that call c tripped (open_keys.py: every process refuses it without a round trip).
local function announce_loop_trip(key, c, now, p)
  local prefix, marker = loop_marker(key, c.fingerprint)
  local refusal = loop_refused(c, now, p, 0, 0)
  local ttl = math_max(math_ceil((c.open_until - now) * 1000), 1)
  redis.call('SET', marker, fmt(c.open_until) .. ' ' .. refusal, 'PX', ttl)
  redis.call('PUBLISH', prefix .. ':open-keys',
    'l ' .. fmt(c.open_until) .. ' ' .. c.fingerprint .. ' ' .. refusal .. ' ' .. key)
end

-- Announce that the calls were forgotten (fingerprint '' = every call): markers deleted.
local function announce_loops_forgotten(key, calls, fingerprint)
  local prefix = loop_marker(key, '')
  for _, c in ipairs(calls) do
    if c.open_until > 0 and (fingerprint == '' or c.fingerprint == fingerprint) then
      redis.call('DEL', select(2, loop_marker(key, c.fingerprint)))
    end
  end
  if fingerprint == '' then fingerprint = '*' end
  redis.call('PUBLISH', prefix .. ':open-keys', 'f ' .. fingerprint .. ' ' .. key)
end

local function new_sends(c, now, p)
  if c.sends <= 0 or now - c.sends_since > p.repeat_window then
    c.sends = 0.0
    c.sends_since = now
  end
end

-- check_loop without counting (loops._peek): the refusal of a refused call, else allowed with
-- the failures counted so far. Changes nothing: the caller does not save.
local function peek_loop(calls, fingerprint, now, p)
  for _, c in ipairs(calls) do
    if c.fingerprint == fingerprint then
      if c.open_until > now then return loop_refused(c, now, p, 0, 0) end
      if c.open_until > 0 then break end
      return loop_verdict(1, 0, 0, 0, 0.0, 0.0, 0.0, c.failures, 0.0, '')
    end
  end
  return loop_verdict(1, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, '')
end

local function check_loop(calls, fingerprint, now, p)
  local c = loop_call(calls, fingerprint, now, p)
  c.last_seen = now
  cooled(c, now)
  if c.open_until > now then return loop_refused(c, now, p, 0, 0) end
  new_sends(c, now, p)
  if c.sends + 1 >= p.repeats and p.refuse_repeats then
    return loop_verdict(0, REPEAT_LOOP, 0, 0, c.sends + 1, p.repeat_window,
      c.sends_since + p.repeat_window - now, c.failures, c.status, c.error)
  end
  c.sends = c.sends + 1
  local repeated = 0
  if c.sends == p.repeats then repeated = 1 end
  return loop_verdict(1, 0, 0, repeated, c.sends, p.repeat_window, 0.0, c.failures, c.status,
    c.error)
end

-- failed: true, false, or nil (the outcome is not counted); send: count a send first.
local function note_loop(calls, fingerprint, failed, status, err, now, p, send)
  local c = loop_call(calls, fingerprint, now, p)
  c.last_seen = now
  cooled(c, now)
  local repeated = 0
  if send then
    new_sends(c, now, p)
    c.sends = c.sends + 1
    if c.sends == p.repeats then repeated = 1 end
  end
  if not failed then
    if failed ~= nil and c.open_until <= 0 then
      c.failures = 0.0
      c.failures_since = 0.0
    end
    if repeated == 1 then
      return loop_verdict(1, 0, 0, 1, c.sends, p.repeat_window, 0.0, c.failures, c.status,
        c.error)
    end
    return loop_verdict(1, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, '')
  end
  if c.failures <= 0 or now - c.failures_since > p.failure_window then
    c.failures = 0.0
    c.failures_since = now
  end
  c.failures = c.failures + 1
  c.status = status
  c.error = err
  if c.failures >= p.failures and c.open_until <= 0 then
    if c.last_trip > 0 and now - c.last_trip <= ESCALATION_WINDOW then
      c.strikes = math_min(c.strikes + 1, MAX_STRIKES)
    else
      c.strikes = 0.0
    end
    c.last_trip = now
    c.open_until = now + math_min(p.cooldown * 2 ^ c.strikes, p.cooldown_max)
    announce_loop_trip(KEYS[1], c, now, p)
    return loop_verdict(1, FAILURE_LOOP, 1, repeated, c.failures, p.failure_window,
      c.open_until - now, c.failures, c.status, c.error)
  end
  if repeated == 1 then
    return loop_verdict(1, 0, 0, 1, c.sends, p.repeat_window, 0.0, c.failures, status, err)
  end
  return loop_verdict(1, 0, 0, 0, c.failures, p.failure_window, 0.0, c.failures, status, err)
end

-- A note's outcome as the scripts take it: '1' failed, '0' succeeded, '' not counted (nil).
local function note_outcome(arg)
  if arg == '' then return nil end
  return arg == '1'
end

-- ---------------------------------------------------------------------------------------------
-- The operation's body follows.
