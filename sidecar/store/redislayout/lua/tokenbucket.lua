-- floodgate TokenBucket (sidecar/limiter/ALGORITHMS.md sections 3 and 8).
--
-- One body, two entry points in the library (library.go): a take of n
-- tokens, and a lease, which gives back r unused tokens of an earlier
-- lease, then takes between n and m tokens in one step, or denies and
-- takes nothing. A take is the lease with m = n and r = 0: it passes
-- no ARGV after the limit's constants, and answers the first four
-- values of the reply.
--
-- KEYS[1]  state, fg:{<tag>}:tb:2, a string of six little-endian doubles
--          (struct '<dddddd'): L level in units, T last tick, and the
--          scale q, U, K, C the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost of the request (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, a full bucket
-- ARGV[9]  FT ticks from empty to full
-- ARGV[10] m, the most tokens to take, n included (a lease; a take: n)
-- ARGV[11] r, unused tokens of an earlier lease to give back first (a
--          lease; a take: 0)
-- ARGV[12] the window of the earlier lease (unused: a bucket has none)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us,
--           granted, window (0), valid_for_us (0)}; a take answers the
--           first four
--
-- Every number is an integer below 2^53, so Lua's doubles are exact (and so
-- is their binary encoding), and math.floor(a / b), math.ceil(a / b) equal
-- Go's integer division. The instants (T + w) * q - now are computed as
-- (T * q - now) + w * q: the first form passes 2^53 when now is within a
-- fill time of 2^53 µs.
-- m and r are at most C, so m * K and r * K are at most CU.
--
-- Cost: at most three redis.call (TIME unless ARGV[1] is set, GET, and SET
-- with PX when tokens were taken or given back), and one write command,
-- so a replica applies one SET. A peek (n = 0) is decided as a cost of 1,
-- and spends and writes nothing.
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
local m, r = tonumber(ARGV[10]) or n, tonumber(ARGV[11]) or 0
if m < n then m = n end
if n <= C and m > C then m = C end
if r > C then r = C end

local t = floor(now / q)
local st = redis.call('GET', KEYS[1])
local L, T
if not st then
  L, T = CU, t
else
  if #st ~= 48 then
    return redis.error_reply('ERR floodgate: corrupt TokenBucket state at ' .. KEYS[1])
  end
  local sq, su, sk, sc
  L, T, sq, su, sk, sc = struct.unpack('<dddddd', st)
  if sq ~= q or su ~= U or sk ~= K or sc ~= C then
    local spent = sc - floor(L / sk)
    if spent > C then spent = C end
    L = CU - spent * K
    T = ceil(T * sq / q)
  end
end
if t > T then
  local e = t - T
  if e > FT then e = FT end
  L = L + e * U
  if L > CU then L = CU end
  T = t
end

local changed = false
if r > 0 then
  local L2 = L + r * K
  if L2 > CU then L2 = CU end
  if L2 ~= L then L, changed = L2, true end
end

-- A Cost of 0 (a peek, or no request) is decided as a cost of 1.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, g = 0, 0, 0
local a = floor(L / K)
if n > C then
  retry = P
elseif a >= n1 then
  allowed = 1
  g = m
  if g > a then g = a end
  L = L - g * K
else
  retry = (T * q - now) + ceil((n1 * K - L) / U) * q
end

local reset = 0
if L ~= CU then
  reset = (T * q - now) + ceil((CU - L) / U) * q
end

if g > 0 or changed then
  local rs = reset
  if rs < 0 then rs = 0 end
  redis.call('SET', KEYS[1], struct.pack('<dddddd', L, T, q, U, K, C), 'PX', ceil(rs / 1000) + 1000)
end
return {allowed, floor(L / K), reset, retry, g, 0, 0}
