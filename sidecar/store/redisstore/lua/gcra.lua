-- floodgate GCRA, redis-cell CL.THROTTLE semantics
-- (sidecar/limiter/ALGORITHMS.md section 4).
--
-- KEYS[1]  state hash, fg:{<tag>}:gcra: A=TAT whole ticks, F=TAT fraction
--          in units (0 <= F < U), sq, su, sk, sc = the scale (q, U, K, C)
--          the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, the tolerance in units
-- ARGV[9]  FT = ceil(CU/U)     ARGV[10] PW (unused here)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number is an integer below 2^52, so Lua's doubles are exact and
-- math.floor(a / b), math.ceil(a / b) equal Go's integer division.
local floor, ceil = math.floor, math.ceil

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
local fresh = not st[1]
local A, F
if fresh then
  A, F = t, 0
else
  A, F = tonumber(st[1]), tonumber(st[2])
  local sq, su, sk, sc = tonumber(st[3]), tonumber(st[4]), tonumber(st[5]), tonumber(st[6])
  if not (A and F and sq and su and sk and sc) then
    return redis.error_reply('ERR floodgate: corrupt GCRA state at ' .. KEYS[1])
  end
  if sq ~= q or su ~= U or sk ~= K or sc ~= C then
    -- Limit edited: the whole tokens of debt survive.
    local to = floor(now / sq)
    local bo = A - ceil(sk * sc / su)
    if to > bo then bo = to end
    local Do = 0
    if A >= bo then Do = (A - bo) * su + F end
    local spent = ceil(Do / sk)
    if spent > C then spent = C end
    local D = spent * K
    local b = ceil(bo * sq / q)
    A, F = b + floor(D / U), D % U
  end
end

local b = A - FT
if t > b then b = t end
local D = 0
if A >= b then D = (A - b) * U + F end

local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif n == 0 then
  allowed = 1
elseif D + n * K <= CU then
  D = D + n * K
  A, F = b + floor(D / U), D % U
  allowed, write = 1, true
else
  local w = ceil((D + n * K - CU) / U)
  retry = (b + w) * q - now
end

local reset = 0
if D ~= 0 then
  reset = (b + ceil(D / U)) * q - now
end
local left = CU - D
if left < 0 then left = 0 end

if write then
  redis.call('HSET', KEYS[1], 'A', A, 'F', F, 'sq', q, 'su', U, 'sk', K, 'sc', C)
  local r = reset
  if r < 0 then r = 0 end
  redis.call('PEXPIRE', KEYS[1], ceil(r / 1000) + 1000)
end
return {allowed, floor(left / K), reset, retry}
