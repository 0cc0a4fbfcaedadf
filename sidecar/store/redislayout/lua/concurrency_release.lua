-- floodgate concurrency slots: give one request's lease back
-- (limiter.Slots.Release, sidecar/limiter/slots.go).
--
-- KEYS[1]  the leases, fg:{<tag>}:cc:1 (see concurrency_acquire.lua)
-- ARGV[1]  unused ("" or now), for the calling convention
-- ARGV[2]  the lease id, as acquire took it
-- Reply:   {removed (1 or 0), leases left (expired ones included), 0, 0}
--
-- Releasing a lease the key does not hold (it expired and was dropped, or
-- was never taken) changes nothing. The key's TTL is left as it is: it
-- still outlives every lease the key holds.
local removed = redis.call('ZREM', KEYS[1], ARGV[2])
return {removed, redis.call('ZCARD', KEYS[1]), 0, 0}
