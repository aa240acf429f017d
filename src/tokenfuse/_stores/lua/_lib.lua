--[[
_lib.lua: the policy core (tokenfuse/_core/velocity.py, bucket.py, admission.py) in Lua 5.1.

Prepended to every operation's script when it is loaded, so each script is one self-contained
chunk and no rule is written twice. Every function mirrors the Python function of the same
name with the same arithmetic in the same order: Lua numbers are IEEE doubles and exp/pow come
from the same libm, so the results are bit-identical to the core's (the differential test
reads the state back from Redis and compares it field by field).

Redis runs a script's whole chunk on every EVALSHA, and each function definition costs a
closure then, more for each outer local it captures; so the loader (redis_scripts.py) writes
the constants below into the code as literals (keep each one 'local NAME = <literal>' on its
own line) and keeps only the top-level definitions an operation uses. Keep every definition
a top-level 'local' statement.

State. Each identity is one string, <prefix>:{<key>}, written with its TTL by one SET ... PX:
a velocity block, then a bucket block, each only when the identity has that state, of
little-endian doubles in this order (the layout table is in redis_codec.py, the reasons for
it in docs/design.md#state-layout); load_velocity, load_bucket and save follow it:

  velocity block (44 doubles): first_seen, head, minute, minute_amount, pending_minute,
    pending_amount, baseline, weight, samples, learned_at, open_until, strikes, last_trip,
    trip_reason, trip_rate, trip_limit, trip_baseline, amounts[0..12], largest[0..12],
    limit_override
  bucket block (8 doubles): tokens, updated, use_minute, use_amount, hot_since, alerted,
    capacity_override, rate_override

Replies are text, so that clients with decode_responses=True work: numbers with %.17g (exact;
Redis would truncate a Lua number to an integer), None as 'nan'.
--]]

local SLOT_SECONDS = 5.0
local SLOTS = 13
local WINDOW_SECONDS = 60.0
local MINUTE = 60.0
local LN2 = 0.69314718055994529 -- math.log(2.0), to the last bit
local MANUAL = 1 -- trip reasons
local LOOP = 2
local COLD = 3
local FULL = -1.0
local EPSILON = 1e-6 -- bucket.py: float resolution of timestamps near 1.7e9
-- struct formats: little-endian doubles; literals, as building them costs on every call
local V_FORMAT = '<dddddddddddddddddddddddddddddddddddddddddddd' -- 44: velocity block
local B_FORMAT = '<dddddddd' -- 8: bucket block
local OPEN_FORMAT = '<ddddddddddd' -- 11: the velocity block up to open_until (the gate's)
local V_SIZE = 352 -- bytes of the velocity block
local B_SIZE = 64 -- bytes of the bucket block
local VP_FORMAT = '<dddddddddd' -- 10: velocity policy
local BP_FORMAT = '<dddd' -- 4: bucket policy

-- ---------------------------------------------------------------------------------------------
-- Plumbing: clock, doubles, replies

local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
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
    if x == math.huge then
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
      mantissa = math.floor(mantissa / 256)
    end
    bytes[7] = (exponent % 16) * 16 + mantissa
    bytes[8] = sign + math.floor(exponent / 16)
    return string.char(unpack(bytes))
  end
  local function bytes_double(s, at)
    local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, at, at + 7)
    local sign = 1
    if b8 >= 128 then sign = -1 end
    local exponent = (b8 % 128) * 16 + math.floor(b7 / 16)
    local mantissa = (((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 65536
      + b2 * 256 + b1
    if exponent == 0 then return sign * math.ldexp(mantissa, -1074) end
    if exponent == 2047 then return sign * math.huge end
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

local function opt(x) -- None travels as 'nan'
  if x == nil then return 'nan' end
  return fmt(x)
end

-- ---------------------------------------------------------------------------------------------
-- Policies: a binary argument, '' when the operation has none. -1 stands for None.

local function velocity_params(arg)
  if arg == '' then return nil end
  local limit, spike, min_baseline, learning, samples, cold, half_life, cooldown, cooldown_max,
    escalation = unpack_doubles(VP_FORMAT, arg)
  if limit < 0 then limit = nil end
  if cold < 0 then cold = nil end
  return {
    limit = limit, spike_multiple = spike, min_baseline = min_baseline,
    learning_period = learning, min_samples = samples, cold_start_limit = cold,
    half_life = half_life, cooldown = cooldown, cooldown_max = cooldown_max,
    escalation_window = escalation,
  }
end

local function bucket_params(arg)
  if arg == '' then return nil end
  local rate, capacity, fraction, after = unpack_doubles(BP_FORMAT, arg)
  return {rate = rate, capacity = capacity, near_limit_fraction = fraction,
    near_limit_after = after}
end

-- ---------------------------------------------------------------------------------------------
-- State (VelocityState, BucketState) <-> the identity's string

-- The identity's string, or false when it has no state yet.
local function load_state(key)
  local s = redis.call('GET', key)
  if s and #s ~= V_SIZE and #s ~= B_SIZE and #s ~= V_SIZE + B_SIZE then
    error('tokenfuse: ' .. key .. ' holds no tokenfuse state')
  end
  return s
end

local function new_velocity(now)
  local ring, top = {}, {}
  for i = 1, SLOTS do
    ring[i] = 0.0
    top[i] = 0.0
  end
  return {
    first_seen = now, head = -1, minute = -1, minute_amount = 0.0, pending_minute = -1,
    pending_amount = 0.0, baseline = 0.0, weight = 0.0, samples = 0, learned_at = 0.0,
    open_until = 0.0, strikes = 0, last_trip = 0.0, trip_reason = 0, trip_rate = 0.0,
    trip_limit = 0.0, trip_baseline = -1.0, limit_override = -1.0, amounts = ring,
    largest = top,
  }
end

-- The velocity state in string s, or nil. The ring is 1-based: amounts[i + 1] is Python's
-- amounts[i].
local function load_velocity(s)
  if not s or #s == B_SIZE then return nil end
  local n = {unpack_doubles(V_FORMAT, s)}
  return {
    first_seen = n[1], head = n[2], minute = n[3], minute_amount = n[4], pending_minute = n[5],
    pending_amount = n[6], baseline = n[7], weight = n[8], samples = n[9], learned_at = n[10],
    open_until = n[11], strikes = n[12], last_trip = n[13], trip_reason = n[14],
    trip_rate = n[15], trip_limit = n[16], trip_baseline = n[17],
    amounts = {n[18], n[19], n[20], n[21], n[22], n[23], n[24], n[25], n[26], n[27], n[28],
      n[29], n[30]},
    largest = {n[31], n[32], n[33], n[34], n[35], n[36], n[37], n[38], n[39], n[40], n[41],
      n[42], n[43]},
    limit_override = n[44],
  }
end

local function new_bucket(tokens, now)
  return {tokens = tokens, updated = now, use_minute = -1, use_amount = 0.0, hot_since = -1,
    alerted = 0, capacity_override = -1.0, rate_override = -1.0}
end

-- The bucket state in string s, or nil.
local function load_bucket(s)
  if not s or #s == V_SIZE then return nil end
  local tokens, updated, use_minute, use_amount, hot_since, alerted, capacity, rate =
    unpack_doubles(B_FORMAT, s, #s - B_SIZE + 1)
  return {tokens = tokens, updated = updated, use_minute = use_minute, use_amount = use_amount,
    hot_since = hot_since, alerted = alerted, capacity_override = capacity,
    rate_override = rate}
end

-- Write the identity's string with its TTL (ttl ms) in one SET: the velocity block of v, or
-- the one in s as it was; then the bucket block of b, or the one in s. Every operation that
-- writes refreshes the TTL, changed or not: an identity in use never expires, an idle one
-- disappears after ttl (the MemoryStore's touch).
local function save(key, ttl, s, v, b)
  local blob = ''
  if v then
    local a, x = v.amounts, v.largest
    blob = pack(V_FORMAT, v.first_seen, v.head, v.minute, v.minute_amount, v.pending_minute,
      v.pending_amount, v.baseline, v.weight, v.samples, v.learned_at, v.open_until, v.strikes,
      v.last_trip, v.trip_reason, v.trip_rate, v.trip_limit, v.trip_baseline,
      a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
      x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13],
      v.limit_override)
  elseif s and #s ~= B_SIZE then
    blob = string.sub(s, 1, V_SIZE)
  end
  if b then
    blob = blob .. pack(B_FORMAT, b.tokens, b.updated, b.use_minute, b.use_amount, b.hot_since,
      b.alerted, b.capacity_override, b.rate_override)
  elseif s and #s ~= V_SIZE then
    blob = blob .. string.sub(s, -B_SIZE)
  end
  if blob ~= '' then redis.call('SET', key, blob, 'PX', ttl) end
end

-- ---------------------------------------------------------------------------------------------
-- Velocity (velocity.py)

local function advance(v, now)
  local slot = math.floor(now / SLOT_SECONDS)
  if slot > v.head then
    local a, x = v.amounts, v.largest
    for index = math.max(v.head + 1, slot - SLOTS + 1), slot do
      local i = index % SLOTS + 1
      a[i] = 0.0
      x[i] = 0.0
    end
    v.head = slot
  end
  return v.head -- a clock that stepped back writes into the newest slot
end

local function window(v, now)
  local a = v.amounts
  local oldest = (v.head + 1) % SLOTS + 1
  local elapsed = math.min(math.max((now - v.head * SLOT_SECONDS) / SLOT_SECONDS, 0.0), 1.0)
  local total = 0.0 -- sum(amounts): left to right, as CPython < 3.12 adds floats
  for i = 1, SLOTS do total = total + a[i] end
  return total - a[oldest] * elapsed, math.max(unpack(v.largest))
end

local function learn(v, amount, at, p)
  if v.weight > 0.0 then
    local decay = math.exp(-(at - v.learned_at) * LN2 / p.half_life)
    v.weight = v.weight * decay + 1.0
  else
    v.weight = 1.0
  end
  v.baseline = v.baseline + (amount - v.baseline) / v.weight
  v.samples = v.samples + 1
  v.learned_at = at
end

local function roll_minute(v, now, p)
  local minute = math.floor(now / WINDOW_SECONDS)
  if minute <= v.minute then return end
  if v.minute >= 0 and v.minute_amount > 0.0 then
    local tainted = v.open_until > v.minute * WINDOW_SECONDS
    if v.pending_minute >= 0 and not (tainted and v.pending_minute == v.minute - 1) then
      learn(v, v.pending_amount, (v.pending_minute + 1) * WINDOW_SECONDS, p)
    end
    if tainted then
      v.pending_minute = -1
      v.pending_amount = 0.0
    else
      v.pending_minute = v.minute
      v.pending_amount = v.minute_amount
    end
  end
  v.minute = minute
  v.minute_amount = 0.0
end

local function established(v, now, p)
  return now - v.first_seen >= p.learning_period and v.samples >= p.min_samples
end

local function judge(v, rate, largest, now, p)
  local baseline = nil
  if established(v, now, p) then baseline = v.baseline end
  local ceiling = p.limit
  if v.limit_override >= 0.0 then ceiling = v.limit_override end
  if ceiling ~= nil and rate > ceiling then return MANUAL, ceiling, baseline end
  if baseline ~= nil and baseline >= p.min_baseline then
    local threshold = p.spike_multiple * baseline
    if rate >= threshold and rate - largest >= threshold then return LOOP, threshold, baseline end
    return 0, threshold, baseline
  end
  local cold = p.cold_start_limit
  if cold ~= nil and rate > cold then return COLD, cold, baseline end
  if ceiling == nil then return 0, cold, baseline end
  return 0, ceiling, baseline
end

local function trip(v, reason, rate, limit, baseline, now, p)
  local recent = v.strikes > 0 and now - v.last_trip <= p.escalation_window
  if recent then v.strikes = v.strikes + 1 else v.strikes = 1 end
  local cooldown = math.min(p.cooldown * 2.0 ^ (v.strikes - 1), p.cooldown_max)
  v.open_until = now + cooldown
  v.last_trip = now
  v.trip_reason = reason
  v.trip_rate = rate
  v.trip_limit = limit
  if baseline == nil then v.trip_baseline = -1.0 else v.trip_baseline = baseline end
end

-- A velocity verdict as text: 'allowed tripped reason rate limit baseline multiple
-- retry_after'. ALLOWED is VelocityVerdict(allowed=True), nothing else to report.
local ALLOWED = '1 0 0 0 nan nan nan 0'

local function refusal(v, now, tripped)
  local baseline = nil
  if v.trip_baseline >= 0.0 then baseline = v.trip_baseline end
  local multiple = nil
  if baseline ~= nil and baseline ~= 0.0 and v.trip_reason == LOOP then
    multiple = v.trip_rate / baseline
  end
  return string.format('0 %d %d %.17g %.17g %s %s %.17g', tripped, v.trip_reason, v.trip_rate,
    v.trip_limit, opt(baseline), opt(multiple), v.open_until - now)
end

-- (allowed 0/1, verdict text)
local function gate(v, now)
  if v.open_until > now then return 0, refusal(v, now, 0) end
  return 1, ALLOWED
end

local function record(v, amount, now, p)
  roll_minute(v, now, p)
  local slot = advance(v, now) % SLOTS + 1
  v.amounts[slot] = v.amounts[slot] + amount
  v.largest[slot] = math.max(v.largest[slot], amount)
  v.minute_amount = v.minute_amount + amount
  if v.open_until > now then return 0, refusal(v, now, 0) end
  local rate, largest = window(v, now)
  local reason, limit, baseline = judge(v, rate, largest, now, p)
  if reason ~= 0 and limit ~= nil then
    trip(v, reason, rate, limit, baseline, now, p)
    return 0, refusal(v, now, 1)
  end
  local multiple = nil
  if baseline ~= nil and baseline ~= 0.0 then multiple = rate / baseline end
  return 1, string.format('1 0 0 %.17g %s %s %s 0', rate, opt(limit), opt(baseline),
    opt(multiple))
end

local function reset_velocity(v)
  v.open_until = 0.0
  v.strikes = 0
  v.head = -1
  for i = 1, SLOTS do
    v.amounts[i] = 0.0
    v.largest[i] = 0.0
  end
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
  local elapsed = math.max(now - b.updated, 0.0)
  return math.min(capacity, b.tokens + elapsed * rate)
end

local function track_use(b, cost, now, rate, p)
  local minute = math.floor(now / MINUTE)
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

-- (allowed 0/1, 'allowed remaining capacity rate retry_after near_limit')
local function consume(b, cost, now, p)
  local capacity, rate = limits_of(b, p)
  local tokens = level(b, now, capacity, rate)
  b.updated = math.max(now, b.updated)
  if tokens < cost - EPSILON then
    b.tokens = tokens
    return 0, string.format('0 %.17g %.17g %.17g %.17g 0', tokens, capacity, rate,
      (cost - tokens) / rate)
  end
  b.tokens = math.max(tokens - cost, 0.0)
  local near_limit = track_use(b, cost, now, rate, p)
  return 1, string.format('1 %.17g %.17g %.17g 0 %d', b.tokens, capacity, rate, near_limit)
end

-- ---------------------------------------------------------------------------------------------
-- Admission (admission.py): latch, then bucket, then velocity.
-- Returns allowed (0/1) and the two verdicts' text, nil where the Python verdict is None.

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

-- ---------------------------------------------------------------------------------------------
-- Announcements (open_keys.py): every process keeps a local view of the open keys, so its gate
-- needs no round trip. Only when a latch opens or is reset, never on an ordinary decision, a
-- script
--   * PUBLISHes on '<prefix>:open-keys' (plain PUBLISH reaches every node of a Cluster), a
--     message ending with the key (a prefix may hold spaces):
--       'o <open_until> <the gate's refusal: 8 fields> <key>'   the key opened
--       'c <key>'                                               the key was reset (closed)
--       'u <key>'                                               its live overrides changed
--   * keeps a marker '<prefix>:open:{<key>}' = '<open_until> <refusal>' while the key is open
--     (PX: it expires with the latch; same hash tag, so same slot as the key): a process
--     that subscribes later finds the open keys with one SCAN.

local function split_key(key) -- '<prefix>:{<key>}' -> prefix, '{<key>}'
  local prefix, tagged = string.match(key, '^(.-):({.*)$')
  return prefix, tagged
end

local function announce(key, message)
  local prefix, tagged = split_key(key)
  if string.sub(message, 1, 1) == 'c' then redis.call('DEL', prefix .. ':open:' .. tagged) end
  redis.call('PUBLISH', prefix .. ':open-keys', message .. ' ' .. key)
end

-- Announce that v's latch opened during this script (it was open_until `before`).
local function announce_trip(key, v, before, now)
  if v == nil or v.open_until == before then return end
  local prefix, tagged = split_key(key)
  local state = fmt(v.open_until) .. ' ' .. refusal(v, now, 0)
  local ttl = math.max(math.ceil((v.open_until - now) * 1000), 1)
  redis.call('SET', prefix .. ':open:' .. tagged, state, 'PX', ttl)
  redis.call('PUBLISH', prefix .. ':open-keys', 'o ' .. state .. ' ' .. key)
end

-- ---------------------------------------------------------------------------------------------
-- The operation's body follows.
