-- floodgate FixedWindow, windows aligned to the Unix epoch
-- (sidecar/limiter/ALGORITHMS.md section 5.1).
--
-- KEYS[1]  state, fg:{<tag>}:fw:2, a string of two little-endian doubles
--          (struct '<dd'): W window start in µs, N count
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number is an integer below 2^53: sums and differences of times
-- and counts only, exact in Lua's doubles. W + P - now is computed as
-- (W - now) + P, which stays below 2^53 whatever now is.
--
-- Cost: at most three redis.call (TIME unless ARGV[1] is set, GET, and SET
-- with PX on an allow), and one write command, so a replica applies one SET.
local ceil = math.ceil

local now = tonumber(ARGV[1])
if not now then
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])

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
  -- ws < W: the clock went back, keep the stored window.
  if ws > W then W, N = ws, 0 end
end

-- A peek (n = 0) is decided as a cost of 1, and spends and writes nothing.
local n1 = n
if n1 < 1 then n1 = 1 end
local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif N + n1 <= C then
  allowed = 1
  if n > 0 then
    N = N + n
    write = true
  end
else
  retry = (W - now) + P
end

local reset = 0
if N ~= 0 then reset = (W - now) + P end
local remaining = C - N
if remaining < 0 then remaining = 0 end

if write then
  local r = reset
  if r < 0 then r = 0 end
  redis.call('SET', KEYS[1], struct.pack('<dd', W, N), 'PX', ceil(r / 1000) + 1000)
end
return {allowed, remaining, reset, retry}
