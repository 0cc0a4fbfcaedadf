-- floodgate SlidingWindow, the sliding-window counter
-- (sidecar/limiter/ALGORITHMS.md section 5.2).
--
-- KEYS[1]  state, fg:{<tag>}:sw:2, a string of three little-endian doubles
--          (struct '<ddd'): W current window start in µs, the current
--          window's count and the previous window's count
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- ARGV[5]  q tick in µs        ARGV[6]  PW = ceil(P/q), the window in ticks
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number is an integer below 2^53, so Lua's doubles are exact and
-- math.floor(a / b) equals Go's integer division. Instants relative to now
-- are computed from W - now first, which keeps them below 2^53.
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
local q, PW = tonumber(ARGV[5]), tonumber(ARGV[6])

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
  -- d <= 0: the same window, or the clock went back.
end

local e = 0
if now > W then e = floor((now - W) / q) end
local x = prev * (PW - e) + cur * PW

-- A peek (n = 0) is decided as a cost of 1, and spends and writes nothing.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif x + n1 * PW <= C * PW then
  allowed = 1
  if n > 0 then
    cur = cur + n
    x = x + n * PW
    write = true
  end
else
  local e2 = PW
  local a = C - cur - n1
  if a >= 0 then e2 = PW - floor(a * PW / prev) end
  if e2 <= PW - 1 then
    retry = (W - now) + e2 * q
  else
    -- Not in this window: the next one has prev' = cur, cur' = 0.
    local b = C - n1
    if cur <= b then
      retry = (W - now) + P
    else
      local e3 = PW - floor(b * PW / cur)
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
local left = C * PW - x
if left < 0 then left = 0 end

if write then
  local r = reset
  if r < 0 then r = 0 end
  redis.call('SET', KEYS[1], struct.pack('<ddd', W, cur, prev), 'PX', ceil(r / 1000) + 1000)
end
return {allowed, floor(left / PW), reset, retry}
