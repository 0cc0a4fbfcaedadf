-- floodgate SlidingWindow, the sliding-window counter
-- (sidecar/limiter/ALGORITHMS.md sections 5.2 and 8).
--
-- One body, two entry points in the library (library.go): a take of n
-- tokens, and a lease, which gives back r unused tokens of an earlier
-- lease, then takes between n and m tokens in one step, or denies and
-- takes nothing. A take is the lease with m = n and r = 0: it passes
-- no ARGV after the limit's constants, and answers the first four
-- values of the reply.
--
-- KEYS[1]  state, fg:{<tag>}:sw:2, a string of three little-endian doubles
--          (struct '<ddd'): W current window start in µs, the current
--          window's count and the previous window's count
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost of the request (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  PW = ceil(P/q), the window in ticks
-- ARGV[7]  m, the most tokens to take, n included (a lease; a take: n)
-- ARGV[8]  r, unused tokens of an earlier lease to give back first (a
--          lease; a take: 0)
-- ARGV[9]  win, the window start (µs) the earlier lease counted in
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us,
--           granted, window start in µs, valid_for_us}; a take answers
--           the first four
--
-- Every number is an integer below 2^53, so Lua's doubles are exact and
-- math.floor(a / b) equals Go's integer division. Instants relative to now
-- are computed from W - now first, which keeps them below 2^53.
-- m and r are at most C, so m * PW is below 2^51.
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
local q, PW = tonumber(ARGV[5]), tonumber(ARGV[6])
local m, r, win = tonumber(ARGV[7]) or n, tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0
if m < n then m = n end
if n <= C and m > C then m = C end
if r > C then r = C end

local ws = now - now % P
local st = redis.call('GET', KEYS[1])
local W, cur, prev
if not st then
  W, cur, prev = ws, 0, 0
else
  if #st ~= 24 then
    return redis.error_reply('ERR floodgate: corrupt SlidingWindow state at ' .. KEYS[1])
  end
  W, cur, prev = struct.unpack('<ddd', st)
  local d = ws - W
  if d >= 2 * P then
    W, cur, prev = ws, 0, 0
  elseif d > 0 then
    W, cur, prev = ws, 0, cur
  end
end

local changed = false
if r > 0 then
  if W == win then
    local c2 = cur - r
    if c2 < 0 then c2 = 0 end
    if c2 ~= cur then cur, changed = c2, true end
  elseif W - P == win then
    local p2 = prev - r
    if p2 < 0 then p2 = 0 end
    if p2 ~= prev then prev, changed = p2, true end
  end
end

local e = 0
if now > W then e = floor((now - W) / q) end
local x = prev * (PW - e) + cur * PW

-- A Cost of 0 (a peek, or no request) is decided as a cost of 1.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, g = 0, 0, 0
local left = C * PW - x
if left < 0 then left = 0 end
local a = floor(left / PW)
if n > C then
  retry = P
elseif a >= n1 then
  allowed = 1
  g = m
  if g > a then g = a end
  cur = cur + g
  x = x + g * PW
else
  local e2 = PW
  local s = C - cur - n1
  if s >= 0 then e2 = PW - floor(s * PW / prev) end
  if e2 <= PW - 1 then
    retry = (W - now) + e2 * q
  else
    local bb = C - n1
    if cur <= bb then
      retry = (W - now) + P
    else
      local e3 = PW - floor(bb * PW / cur)
      if e3 <= PW - 1 then
        retry = (W - now) + P + e3 * q
      else
        retry = (W - now) + 2 * P
      end
    end
  end
end

local reset = 0
if cur > 0 then
  reset = (W - now) + 2 * P
elseif prev > 0 then
  reset = (W - now) + P
end
left = C * PW - x
if left < 0 then left = 0 end

if g > 0 or changed then
  local rs = reset
  if rs < 0 then rs = 0 end
  redis.call('SET', KEYS[1], struct.pack('<ddd', W, cur, prev), 'PX', ceil(rs / 1000) + 1000)
end
return {allowed, floor(left / PW), reset, retry, g, W, (W - now) + P}
