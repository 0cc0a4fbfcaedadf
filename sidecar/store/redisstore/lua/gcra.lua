-- floodgate GCRA, redis-cell CL.THROTTLE semantics
-- (sidecar/limiter/ALGORITHMS.md section 4).
--
-- KEYS[1]  state hash, fg:{<tag>}:gcra: A=TAT whole ticks (a decimal
--          integer), F=TAT fraction in units (0 <= F < U), sq, su, sk, sc =
--          the scale (q, U, K, C) the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, the tolerance in units
-- ARGV[9]  FT = ceil(CU/U)     ARGV[10] PW (unused here)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number the script computes is an integer below 2^53, so Lua's
-- doubles are exact and math.floor(a / b), math.ceil(a / b) equal Go's
-- integer division. One stored value may be larger: the TAT A is up to a
-- fill time ahead of now, so with q = 1 it passes 2^53 when now is within a
-- fill time (at most 2^50 µs with q = 1) of 2^53 µs, from the year 2219. So
-- A is held as base + off, two exact doubles, and only ever used as A - x
-- with x near A: (base - x) + off is exact. It is written back as the exact
-- decimal string. Likewise (b + w) * q - now is computed as
-- (b * q - now) + w * q.
local floor, ceil = math.floor, math.ceil
local TWO53 = 9007199254740992
local E8 = 100000000

-- parseA splits the decimal string s into base + off, exactly.
local function parseA(s)
  local v = tonumber(s)
  if not v then return nil end
  if v < TWO53 then return v, 0 end
  local len = #s
  return tonumber(string.sub(s, 1, len - 8)) * E8, tonumber(string.sub(s, len - 7))
end

-- formatA returns the decimal string of base + off, exactly.
local function formatA(base, off)
  local v = base + off
  if v < TWO53 then return string.format('%.0f', v) end
  local hi = floor(base / E8)
  local lo = (base - hi * E8) + off
  local carry = floor(lo / E8)
  return string.format('%.0f%08.0f', hi + carry, lo - carry * E8)
end

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])
local q, U, K = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local CU, FT = tonumber(ARGV[8]), tonumber(ARGV[9])

local t = floor(now / q)
local st = redis.call('HMGET', KEYS[1], 'A', 'F', 'sq', 'su', 'sk', 'sc')
local Ab, Ao, F -- A = Ab + Ao
if not st[1] then
  Ab, Ao, F = t, 0, 0
else
  Ab, Ao = parseA(st[1])
  F = tonumber(st[2])
  local sq, su, sk, sc = tonumber(st[3]), tonumber(st[4]), tonumber(st[5]), tonumber(st[6])
  if not (Ab and Ao and F and sq and su and sk and sc) then
    return redis.error_reply('ERR floodgate: corrupt GCRA state at ' .. KEYS[1])
  end
  if sq ~= q or su ~= U or sk ~= K or sc ~= C then
    -- Limit edited: the whole tokens of debt survive.
    local to = floor(now / sq)
    local bo = (Ab - ceil(sk * sc / su)) + Ao
    if to > bo then bo = to end
    local Do = 0
    local ahead = (Ab - bo) + Ao
    if ahead >= 0 then Do = ahead * su + F end
    local spent = ceil(Do / sk)
    if spent > C then spent = C end
    local D = spent * K
    local b = ceil(bo * sq / q)
    Ab, Ao, F = b, floor(D / U), D % U
  end
end

local b = (Ab - FT) + Ao
if t > b then b = t end
local D = 0
local ahead = (Ab - b) + Ao
if ahead >= 0 then D = ahead * U + F end

local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif n == 0 then
  allowed = 1
elseif D + n * K <= CU then
  D = D + n * K
  Ab, Ao, F = b, floor(D / U), D % U
  allowed, write = 1, true
else
  local w = ceil((D + n * K - CU) / U)
  retry = (b * q - now) + w * q
end

local reset = 0
if D ~= 0 then
  reset = (b * q - now) + ceil(D / U) * q
end
local left = CU - D
if left < 0 then left = 0 end

if write then
  redis.call('HSET', KEYS[1], 'A', formatA(Ab, Ao), 'F', F, 'sq', q, 'su', U, 'sk', K, 'sc', C)
  local r = reset
  if r < 0 then r = 0 end
  redis.call('PEXPIRE', KEYS[1], ceil(r / 1000) + 1000)
end
return {allowed, floor(left / K), reset, retry}
