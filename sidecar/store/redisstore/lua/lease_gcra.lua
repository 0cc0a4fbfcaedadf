-- floodgate GCRA lease (sidecar/limiter/ALGORITHMS.md sections 4 and 8):
-- give back r unused tokens, then take between n and m tokens in one step,
-- or deny and take nothing.
--
-- KEYS[1]  state, fg:{<tag>}:gcra:2, as gcra.lua reads and writes it
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost of the request that asks (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, the tolerance in units
-- ARGV[9]  FT = ceil(CU/U)
-- ARGV[10] m, the most tokens to take, n included
-- ARGV[11] r, unused tokens of an earlier lease to give back first
-- ARGV[12] the window of the earlier lease (unused: GCRA has none)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us,
--           granted, window (0), valid_for_us (0)}
--
-- The arithmetic is gcra.lua's, the TAT held as Ab + Ao: every value but
-- the TAT is an integer below 2^53 (m and r are at most C).
--
-- Cost: at most three redis.call (TIME unless ARGV[1] is set, GET, and SET
-- with PX when tokens were granted or returned).
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
local m, r = tonumber(ARGV[10]), tonumber(ARGV[11])
if m < n then m = n end
if n <= C and m > C then m = C end
if r > C then r = C end

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

local changed = false
if r > 0 then
  local D2 = D - r * K
  if D2 < 0 then D2 = 0 end
  if D2 ~= D then D, changed = D2, true end
end

-- A Cost of 0 (a peek, or no request) is decided as a cost of 1.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, g = 0, 0, 0
local left = CU - D
if left < 0 then left = 0 end
local a = floor(left / K)
if n > C then
  retry = P
elseif a >= n1 then
  allowed = 1
  g = m
  if g > a then g = a end
  D = D + g * K
else
  retry = (b * q - now) + ceil((D + n1 * K - CU) / U) * q
end

local reset = 0
if D ~= 0 then
  reset = (b * q - now) + ceil(D / U) * q
end
left = CU - D
if left < 0 then left = 0 end

if g > 0 or changed then
  Ab, Ao, F = b, floor(D / U), D % U
  local rs = reset
  if rs < 0 then rs = 0 end
  redis.call('SET', KEYS[1], struct.pack('<ddddddd', Ab, Ao, F, q, U, K, C), 'PX', ceil(rs / 1000) + 1000)
end
return {allowed, floor(left / K), reset, retry, g, 0, 0}
