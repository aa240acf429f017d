--[[
_budget.lua: run budgets (tokenfuse/_core/budget.py) in Lua 5.1, after _lib.lua.

Loaded after the policy core and shaken with it (redis_scripts.py): a script keeps only the
definitions it uses. Every function mirrors the Python one of the same name, same arithmetic
in the same order, so the differential test can compare the state double for double.

State. A run is one string, <prefix>:{run:<keyed hash of the run id>}, written with its TTL by
one SET ... PX: nine little-endian doubles in RunState's order:

  token_limit, usd_limit, spent_tokens, spent_usd, reserved_tokens, reserved_usd, expires,
  near_alerted, exceeded_alerted

A limit of -1 means none. Replies are text: 'allowed unit near exceeded' (unit 0 = none,
1 = tokens, 2 = usd) and the nine doubles as %.17g.
--]]

local R_FORMAT = '<ddddddddd' -- 9: run state
local R_SIZE = 72 -- bytes of a run's state
local NO_LIMIT = -1.0
local NEAR_FRACTION = 0.8

-- The run's state unless it is absent or expired (an injected clock may be ahead of PX).
local function load_run(key, now)
  local s = redis.call('GET', key)
  if not s then return nil end
  if #s ~= R_SIZE then error('tokenfuse: ' .. key .. ' holds no tokenfuse run') end
  local r = {}
  r.token_limit, r.usd_limit, r.spent_tokens, r.spent_usd, r.reserved_tokens, r.reserved_usd,
    r.expires, r.near_alerted, r.exceeded_alerted = unpack_doubles(R_FORMAT, s)
  if r.expires <= now then return nil end
  return r
end

local function new_run(now, ttl, token_limit, usd_limit)
  return {
    token_limit = token_limit, usd_limit = usd_limit, spent_tokens = 0.0, spent_usd = 0.0,
    reserved_tokens = 0.0, reserved_usd = 0.0, expires = now + ttl, near_alerted = 0.0,
    exceeded_alerted = 0.0,
  }
end

local function run_numbers(r)
  return fmt(r.token_limit) .. ' ' .. fmt(r.usd_limit) .. ' ' .. fmt(r.spent_tokens) .. ' '
    .. fmt(r.spent_usd) .. ' ' .. fmt(r.reserved_tokens) .. ' ' .. fmt(r.reserved_usd) .. ' '
    .. fmt(r.expires) .. ' ' .. fmt(r.near_alerted) .. ' ' .. fmt(r.exceeded_alerted)
end

local function save_run(key, ttl_ms, r)
  redis.call('SET', key, pack(R_FORMAT, r.token_limit, r.usd_limit, r.spent_tokens,
    r.spent_usd, r.reserved_tokens, r.reserved_usd, r.expires, r.near_alerted,
    r.exceeded_alerted), 'PX', ttl_ms)
end

local function run_reply(allowed, unit, near, exceeded, r)
  return allowed .. ' ' .. unit .. ' ' .. near .. ' ' .. exceeded .. ' ' .. run_numbers(r)
end

local function run_over(spent, reserved, amount, limit)
  return limit >= 0 and spent + reserved + amount > limit
end

local function run_near(r)
  local tokens = r.token_limit >= 0 and r.spent_tokens >= NEAR_FRACTION * r.token_limit
  local usd = r.usd_limit >= 0 and r.spent_usd >= NEAR_FRACTION * r.usd_limit
  return tokens or usd
end

-- (near, exceeded) flags of this step, marking the run's first crossing of each
local function run_alerts(r, allowed)
  local near, exceeded = 0, 0
  if r.near_alerted == 0 and run_near(r) then
    r.near_alerted = 1.0
    near = 1
  end
  local over = allowed == 0 or (
    (r.token_limit >= 0 and r.spent_tokens > r.token_limit)
    or (r.usd_limit >= 0 and r.spent_usd > r.usd_limit))
  if r.exceeded_alerted == 0 and over then
    r.exceeded_alerted = 1.0
    exceeded = 1
  end
  return near, exceeded
end

local function run_not_below_zero(value)
  if value < 0 then return 0.0 end
  return value
end

local function open_run(r, now, ttl, token_limit, usd_limit, join)
  if r == nil then return new_run(now, ttl, token_limit, usd_limit) end
  if not join then
    r.token_limit = token_limit
    r.usd_limit = usd_limit
  end
  r.expires = now + ttl
  return r
end

-- allowed, unit code
local function run_reserve(r, now, ttl, tokens, usd)
  r.expires = now + ttl
  local unit = 0
  if run_over(r.spent_tokens, r.reserved_tokens, tokens, r.token_limit) then
    unit = 1
  elseif run_over(r.spent_usd, r.reserved_usd, usd, r.usd_limit) then
    unit = 2
  end
  if unit ~= 0 then return 0, unit end
  r.reserved_tokens = r.reserved_tokens + tokens
  r.reserved_usd = r.reserved_usd + usd
  return 1, 0
end

local function run_settle(r, now, ttl, held_tokens, held_usd, tokens, usd)
  r.expires = now + ttl
  r.reserved_tokens = run_not_below_zero(r.reserved_tokens - held_tokens)
  r.reserved_usd = run_not_below_zero(r.reserved_usd - held_usd)
  r.spent_tokens = r.spent_tokens + tokens
  r.spent_usd = r.spent_usd + usd
end
