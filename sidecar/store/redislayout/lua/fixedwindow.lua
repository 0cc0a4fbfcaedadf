-- floodgate FixedWindow, windows aligned to the Unix epoch
-- (sidecar/limiter/ALGORITHMS.md sections 5.1 and 8).
--
-- One body, two entry points in the library (library.go): a take of n
-- tokens, and a lease, which gives back r unused tokens of an earlier
-- lease, then takes between n and m tokens in one step, or denies and
-- takes nothing. A take is the lease with m = n and r = 0: it passes
-- no ARGV after the limit's constants, and answers the first four
-- values of the reply.
--
-- KEYS[1]  state, fg:{<tag>}:fw:2, a string of two little-endian doubles
--          (struct '<dd'): W window start in µs, N count
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost of the request (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- ARGV[5]  m, the most tokens to take, n included (a lease; a take: n)
-- ARGV[6]  r, unused tokens of an earlier lease to give back first (a
--          lease; a take: 0)
-- ARGV[7]  win, the window start (µs) the earlier lease counted in; the
--          tokens go back only if it is the current window
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us,
--           granted, window start in µs, valid_for_us}; a take answers
--           the first four
--
-- Every number is an integer below 2^53: sums and differences of times
-- and counts only, exact in Lua's doubles. W + P - now is computed as
-- (W - now) + P, which stays below 2^53 whatever now is.
--
-- Cost: at most three redis.call (TIME unless ARGV[1] is set, GET, and SET
-- with PX when tokens were taken or given back), and one write command,
-- so a replica applies one SET. A peek (n = 0) is decided as a cost of 1,
-- and spends and writes nothing.
local ceil = math.ceil

local now = tonumber(ARGV[1])
if not now then
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])
local m, r, win = tonumber(ARGV[5]) or n, tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or 0
if m < n then m = n end
if n <= C and m > C then m = C end
if r > C then r = C end

local ws = now - now % P
local st = redis.call('GET', KEYS[1])
local W, N
if not st then
  W, N = ws, 0
else
  if #st ~= 16 then
    return redis.error_reply('ERR floodgate: corrupt FixedWindow state at ' .. KEYS[1])
  end
  W, N = struct.unpack('<dd', st)
  if ws > W then W, N = ws, 0 end
end

local changed = false
if r > 0 and W == win then
  local N2 = N - r
  if N2 < 0 then N2 = 0 end
  if N2 ~= N then N, changed = N2, true end
end

-- A Cost of 0 (a peek, or no request) is decided as a cost of 1.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, g = 0, 0, 0
local a = C - N
if a < 0 then a = 0 end
if n > C then
  retry = P
elseif a >= n1 then
  allowed = 1
  g = m
  if g > a then g = a end
  N = N + g
else
  retry = (W - now) + P
end

local reset = 0
if N ~= 0 then reset = (W - now) + P end
local remaining = C - N
if remaining < 0 then remaining = 0 end

if g > 0 or changed then
  local rs = reset
  if rs < 0 then rs = 0 end
  redis.call('SET', KEYS[1], struct.pack('<dd', W, N), 'PX', ceil(rs / 1000) + 1000)
end
return {allowed, remaining, reset, retry, g, W, (W - now) + P}
