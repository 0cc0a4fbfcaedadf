-- floodgate GCRA, redis-cell CL.THROTTLE semantics
-- (sidecar/limiter/ALGORITHMS.md section 4).
--
-- KEYS[1]  state, fg:{<tag>}:gcra:2, a string of seven little-endian
--          doubles (struct '<ddddddd'): the TAT as Ab + Ao whole ticks, F
--          the TAT fraction in units (0 <= F < U), and the scale q, U, K, C
--          the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, the tolerance in units
-- ARGV[9]  FT = ceil(CU/U)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number the script computes is an integer below 2^53, so Lua's
-- doubles are exact and math.floor(a / b), math.ceil(a / b) equal Go's
-- integer division. One value may be larger: the TAT A is up to a fill
-- time ahead of now, so with q = 1 it passes 2^53 when now is within a
-- fill time (at most 2^50 µs with q = 1) of 2^53 µs, from the year 2219. So
-- A is held, and stored, as Ab + Ao, two exact doubles (Ab a tick near
-- now, Ao at most a fill time in ticks), and only ever used as A - x with
-- x near A: (Ab - x) + Ao is exact. Likewise (b + w) * q - now is computed
-- as (b * q - now) + w * q.
--
-- Cost: at most three redis.call (TIME unless ARGV[1] is set, GET, and SET
-- with PX on an allow), and one write command, so a replica applies one SET.
local floor, ceil = math.floor, math.ceil

local now = tonumber(ARGV[1])
if not now then
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])
local q, U, K = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local CU, FT = tonumber(ARGV[8]), tonumber(ARGV[9])

local t = floor(now / q)
local st = redis.call('GET', KEYS[1])
local Ab, Ao, F -- A = Ab + Ao
if not st then
  Ab, Ao, F = t, 0, 0
else
  if #st ~= 56 then
    return redis.error_reply('ERR floodgate: corrupt GCRA state at ' .. KEYS[1])
  end
  local sq, su, sk, sc
  Ab, Ao, F, sq, su, sk, sc = struct.unpack('<ddddddd', st)
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

-- A peek (n = 0) is decided as a cost of 1, and spends and writes nothing.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif D + n1 * K <= CU then
  allowed = 1
  if n > 0 then
    D = D + n * K
    Ab, Ao, F = b, floor(D / U), D % U
    write = true
  end
else
  local w = ceil((D + n1 * K - CU) / U)
  retry = (b * q - now) + w * q
end

local reset = 0
if D ~= 0 then
  reset = (b * q - now) + ceil(D / U) * q
end
local left = CU - D
if left < 0 then left = 0 end

if write then
  local r = reset
  if r < 0 then r = 0 end
  redis.call('SET', KEYS[1], struct.pack('<ddddddd', Ab, Ao, F, q, U, K, C), 'PX', ceil(r / 1000) + 1000)
end
return {allowed, floor(left / K), reset, retry}
