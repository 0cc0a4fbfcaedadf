-- floodgate SlidingLog, an exact log of admitted units
-- (sidecar/limiter/ALGORITHMS.md section 5.3).
--
-- KEYS[1]  the log, fg:{<tag>}:sl:2, a sorted set: one member per admitted
--          unit, score = its timestamp in µs, member = "<ts>:<i>" where i
--          counts the units admitted at ts (entries leave only by whole
--          timestamps, so ZCOUNT ts ts + 1 is always a fresh i)
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  n, the cost (an integer >= 0)
-- ARGV[3]  C = Requests        ARGV[4]  P period in microseconds
-- Reply:   {allowed (1 or 0), remaining, reset_after_us, retry_after_us}
--
-- As in the pseudocode, every call of a non-zero cost first drops the
-- entries at or before t - P (an empty log then vanishes), so that a clock
-- that later goes back does not bring them back. A peek (n = 0) is decided
-- as a cost of 1 and is read-only: it counts those entries out instead.
-- Only an admitted request of non-zero cost adds entries and sets the TTL.
-- Timestamps are below 2^53, exact as scores; instants relative to now are
-- computed from ts - now first. A call adds at most C entries, C at most
-- 100000 (limiter.MaxLogRequests), checked here too.
local ceil = math.ceil

local function int(x)
  return string.format('%.0f', x)
end

local now = tonumber(ARGV[1])
if not now then
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
end
local n = tonumber(ARGV[2])
local C, P = tonumber(ARGV[3]), tonumber(ARGV[4])
-- A store user may call this function with ARGV of its own: a capacity
-- beyond limiter.MaxLogRequests would let one call add that many entries
-- and hold the server, so it is refused before anything is read.
if not n or not C or not P or n < 0 or C < 1 or C > 100000 or P < 1 then
  return redis.error_reply('ERR floodgate: SlidingLog arguments out of range (capacity 1 to 100000, cost >= 0, period >= 1)')
end

local newest = nil
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if top[2] then newest = tonumber(top[2]) end
local t = now
if newest and newest > now then t = newest end
local expired, cnt = 0, 0
if n == 0 then
  expired = redis.call('ZCOUNT', KEYS[1], '-inf', int(t - P))
  cnt = redis.call('ZCARD', KEYS[1]) - expired
else
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(t - P))
  cnt = redis.call('ZCARD', KEYS[1])
end
local n1 = n
if n1 < 1 then n1 = 1 end

local allowed, retry = 0, 0
if n > C then
  retry = P
elseif cnt + n1 <= C then
  allowed = 1
  if n > 0 then
    local base = redis.call('ZCOUNT', KEYS[1], int(t), int(t))
    local ts = int(t)
    local i = 0
    while i < n do
      local args = {}
      local m = n - i
      if m > 1000 then m = 1000 end
      for j = 1, m do
        args[2 * j - 1] = ts
        args[2 * j] = ts .. ':' .. int(base + i + j)
      end
      redis.call('ZADD', KEYS[1], unpack(args))
      i = i + m
    end
    cnt = cnt + n
    newest = t
  end
else
  -- The k-th oldest entry in the window: the expired ones come first.
  local k = expired + cnt + n1 - C
  local kth = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  retry = (tonumber(kth[2]) - now) + P
end

local reset = 0
if cnt > 0 then reset = (newest - now) + P end
local remaining = C - cnt
if remaining < 0 then remaining = 0 end

if allowed == 1 and n > 0 and n <= C then
  local r = reset
  if r < 0 then r = 0 end
  redis.call('PEXPIRE', KEYS[1], ceil(r / 1000) + 1000)
end
return {allowed, remaining, reset, retry}
