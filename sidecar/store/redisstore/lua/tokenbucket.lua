-- floodgate TokenBucket (sidecar/limiter/ALGORITHMS.md section 3).
--
-- KEYS[1]  state, fg:{<tag>}:tb:2, a string of six little-endian doubles
--          (struct '<dddddd'): L level in units, T last tick, and the
--          scale q, U, K, C the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, a full bucket
-- ARGV[9]  FT ticks from empty to full
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number is an integer below 2^53, so Lua's doubles are exact (and so
-- is their binary encoding), and math.floor(a / b), math.ceil(a / b) equal
-- Go's integer division. The instants (T + w) * q - now are computed as
-- (T * q - now) + w * q: the first form passes 2^53 when now is within a
-- fill time of 2^53 µs.
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
    -- Limit edited: the whole tokens spent survive (section 3.1).
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

-- A peek (n = 0) is decided as a cost of 1, and spends and writes nothing.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif n1 * K <= L then
  allowed = 1
  if n > 0 then
    L = L - n * K
    write = true
  end
else
  local w = ceil((n1 * K - L) / U)
  retry = (T * q - now) + w * q
end

local reset = 0
if L ~= CU then
  reset = (T * q - now) + ceil((CU - L) / U) * q
end

if write then
  local r = reset
  if r < 0 then r = 0 end
  redis.call('SET', KEYS[1], struct.pack('<dddddd', L, T, q, U, K, C), 'PX', ceil(r / 1000) + 1000)
end
return {allowed, floor(L / K), reset, retry}
