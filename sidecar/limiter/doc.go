// Package limiter holds floodgate's rate-limiting math: the algorithms, the
// limit and decision types, and the Store interface that the in-memory and
// Redis stores implement.
//
// The package is pure. It imports no Redis, no net/http and no Kubernetes,
// and every function that needs the time takes it as a parameter, in the
// style of golang.org/x/time/rate's AllowN(t, n). Limiter applies a Limit to
// a single key; Params.Take and Params.TakeLog are the per-key cores that
// the stores call.
//
// # Exact, portable arithmetic
//
// The same decisions must come out of Go and out of the Redis Lua scripts,
// whose numbers are IEEE doubles. So time is integer microseconds since the
// Unix epoch, all state is integers, and every intermediate value stays
// below 2^52. The rate Requests/Period is never rounded: NewParams scales it
// to integer units (TickUnits refilled per tick, TokenUnits per token), and
// every division rounds in the direction that never admits more than the
// limit and never reports a RetryAfter of zero on a deny. ALGORITHMS.md
// beside this file gives the state layout and pseudocode of every
// algorithm, which the Lua scripts mirror line by line.
//
// # Algorithms and when to pick them
//
// TokenBucket: a bucket of Capacity tokens (Burst, or Requests) refills
// continuously at Requests per Period; a request of cost n takes n tokens.
// It allows bursts up to the capacity and a steady average at the rate: the
// knobs of AWS API Gateway (rate and burst) and Stripe. The usual default
// for APIs.
//
// GCRA: the generic cell rate algorithm with redis-cell's CL.THROTTLE
// semantics (max_burst = Capacity-1, quantity = cost, limit =
// max_burst+1). It stores a single theoretical arrival time instead of a
// level and a timestamp. With the clock moving forward it admits exactly
// what TokenBucket admits; a leaky bucket used as a meter (Shopify's API,
// nginx limit_req) is the same algorithm, its water level being GCRA's
// debt. Pick it for redis-cell compatible behaviour or to mirror those
// APIs.
//
// SlidingWindow: the sliding-window counter popularised by Cloudflare. It
// keeps the counts of the current and the previous epoch-aligned window and
// estimates the last Period as prev*(overlap of the previous window) + cur.
// Constant memory, no boundary burst of twice the limit, and an estimate
// that assumes the previous window's requests were spread evenly. Pick it
// for "N per period" quotas that should not reset abruptly.
//
// FixedWindow: a counter per window aligned to the Unix epoch, as
// envoyproxy/ratelimit does. Cheapest and easiest to explain ("100 per
// calendar minute"), but a client can send up to twice the limit around a
// window boundary. Pick it for quotas that are meant to reset at fixed
// instants.
//
// SlidingLog: an exact log of admitted request timestamps (a sorted set in
// Redis). Exact for any window position, but its memory is O(Requests) per
// key: 16 bytes per run of equal timestamps in memory, about 50 to 100
// bytes per admitted unit in a Redis sorted set. Requests is capped at
// MaxLogRequests. Pick it only for small limits that must be exact.
//
// # Leases and split counters
//
// Params.Lease takes a batch of tokens from a key in one step (and gives
// back what an earlier batch did not use), so that a sidecar can spend
// them locally: the Leaser interface is the stores' side of it, LeaseSize
// sizes a batch from the local arrival rate and what the key has left.
// Every algorithm but SlidingLog can lease (Algorithm.Leasable says why
// not). SplitLimit spreads a limit over sub-counters whose limits add up
// to it exactly. ALGORITHMS.md sections 8 and 9 give the arithmetic.
//
// # Edge cases, for every algorithm
//
// A cost of 0 is a peek: it asks whether at least one unit is left, and
// is decided exactly as a cost of 1 (allowed when one unit is left, else
// denied with the wait a cost of 1 would get), but it spends nothing and
// changes no state, so a gateway can check a key before a request and
// charge it the real cost afterwards. A cost above the capacity is always
// denied, spends nothing, and gets RetryAfter = Period (it can never be
// admitted under this limit; the Period is a meaningful back-off of at
// least one second). Time going backwards never mints tokens: the state
// keeps its newest instant. A deny always carries RetryAfter >= 1µs, so a
// Retry-After header rounded up to whole seconds is never 0. A limit edit
// keeps what a key has spent.
package limiter
