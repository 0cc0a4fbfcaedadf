-- floodgate GCRA, redis-cell CL.THROTTLE semantics
-- (sidecar/limiter/ALGORITHMS.md sections 4 and 8).
--
-- One body, two entry points in the library (library.go): a take of n
-- tokens, and a lease, which gives back r unused tokens of an earlier
-- lease, then takes between n and m tokens in one step, or denies and
-- takes nothing. A take is the lease with m = n and r = 0: it passes
-- no ARGV after the limit's constants, and answers the first four
-- values of the reply.
--
-- KEYS[1]  state, fg:{<tag>}:gcra:2, a string of seven little-endian
--          doubles (struct '<ddddddd'): the TAT as Ab + Ao whole ticks, F
--          the TAT fraction in units (0 <= F < U), and the scale q, U, K, C
--          the state was written with
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost of the request (an integer >= 0)
-- ARGV[3]  C capacity          ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  U units refilled per tick
-- ARGV[7]  K units per token   ARGV[8]  CU = C*K, the tolerance in units
-- ARGV[9]  FT = ceil(CU/U)
-- ARGV[10] m, the most tokens to take, n included (a lease; a take: n)
-- ARGV[11] r, unused tokens of an earlier lease to give back first (a
--          lease; a take: 0)
-- ARGV[12] the window of the earlier lease (unused: GCRA has none)
-- ARGV[13] MD, for a take under a limit that delays (onExceed: Delay),
--          the longest a request waits for its slot, in microseconds;
--          absent or 0, a request over the limit is denied (ALGORITHMS.md
--          section 10). A delaying take passes 0, 0, 0 as ARGV[10..12].
-- ARGV[14] MR, with MD: the largest cost that can be admitted
--          (limiter.Params.MaxReserve)
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us,
--           granted, window (0), valid_for_us (0)}; a take answers the
--           first four. Under MD, an admitted request's retry_after_us is
--           its wait for its reserved slot (0: it goes at once), and a
--           denied one's is how long until it would be admitted with a
--           wait of at most MD.
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
-- m and r are at most C.
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
local md, mr = tonumber(ARGV[13]) or 0, tonumber(ARGV[14]) or 0
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
if (md == 0 and n > C) or (md > 0 and n > mr) then
  retry = P
elseif a >= n1 then
  allowed = 1
  g = m
  if g > a then g = a end
  D = D + g * K
else
  retry = (b * q - now) + ceil((D + n1 * K - CU) / U) * q
  if md > 0 then
    if retry <= md then
      -- Its slot comes within MD: reserved now, and the request waits
      -- for it. A peek reserves nothing and does not wait.
      allowed = 1
      if n > 0 then
        g = n
        D = D + n * K
      else
        retry = 0
      end
    else
      retry = retry - md
    end
  end
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
