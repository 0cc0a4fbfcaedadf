-- floodgate FixedWindow, windows aligned to the Unix epoch
-- (sidecar/limiter/ALGORITHMS.md section 5.1).
--
-- KEYS[1]  state hash: a=alg ("fw"), W=window start in µs, N=count
-- KEYS[2]  the counter's SlidingLog sorted set, deleted when this script
--          writes (a new algorithm replaces the old algorithm's state)
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- ARGV[5..10]  unused here
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- Every number is an integer below 2^53: sums and differences of times
-- and counts only, exact in Lua's doubles.
local ceil = math.ceil

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])

local ws = now - now % P
local st = redis.call('HMGET', KEYS[1], 'a', 'W', 'N')
local fresh = st[1] ~= 'fw'
local W, N
if fresh then
  W, N = ws, 0
else
  W, N = tonumber(st[2]), tonumber(st[3])
  if not (W and N) then
    return redis.error_reply('ERR floodgate: corrupt FixedWindow state at ' .. KEYS[1])
  end
  -- ws < W: the clock went back, keep the stored window.
  if ws > W then W, N = ws, 0 end
end

local allowed, retry, write = 0, 0, false
if n > C then
  retry = P
elseif n == 0 then
  allowed = 1
elseif N + n <= C then
  N = N + n
  allowed, write = 1, true
else
  retry = W + P - now
end

local reset = 0
if N ~= 0 then reset = W + P - now end
local remaining = C - N
if remaining < 0 then remaining = 0 end

if write then
  if fresh and st[1] then
    -- Another algorithm's state: replace it whole.
    redis.call('DEL', KEYS[1])
  end
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'a', 'fw', 'W', W, 'N', N)
  local r = reset
  if r < 0 then r = 0 end
  redis.call('PEXPIRE', KEYS[1], ceil(r / 1000) + 1000)
end
return {allowed, remaining, reset, retry}
