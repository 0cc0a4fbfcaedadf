-- floodgate concurrency slots: take or renew one request's lease
-- (limiter.Slots, sidecar/limiter/slots.go).
--
-- KEYS[1]  the leases, fg:{<tag>}:cc:1, a sorted set: one member per
--          request in flight, member = its lease id (decimal), score = the
--          instant its lease expires, in µs since the epoch
-- ARGV[1]  now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2]  the lease id, a decimal integer between 1 and 2^63-1, kept as
--          the member string and never read as a number
-- ARGV[3]  max, the most leases the key may hold at once
-- ARGV[4]  ttl, the lease's lifetime from now, in microseconds
-- Reply:   {acquired (1 or 0), in_flight, 0, 0}: in_flight is the live
--          leases after the call
--
-- Every call first drops the leases whose expiry is at or before now, so
-- the slots of a sidecar that crashed come back once their leases expire.
-- The lease is then taken (or, when the key holds it already, renewed) if
-- the key has room: acquiring and renewing are one operation, and a
-- renewal that comes after its lease expired takes it again when there is
-- room. A taken lease gives the key a TTL that outlives its latest lease by
-- one second; a refusal writes nothing. Scores are below 2^53, exact as
-- doubles; the TTL is computed from (latest - now) first.
local now = tonumber(ARGV[1])
if not now then
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
end
local lease = ARGV[2]
local max, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local n = redis.call('ZCARD', KEYS[1])
local held = redis.call('ZSCORE', KEYS[1], lease)
if not held and n >= max then
  return {0, n, 0, 0}
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), lease)
if not held then n = n + 1 end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local live = tonumber(last[2]) - now
redis.call('PEXPIRE', KEYS[1], math.ceil(live / 1000) + 1000)
return {1, n, 0, 0}
