// Package redisstore is floodgate's limiter.Store on a Redis Cluster (or on
// one standalone redis-server): the shared counters every sidecar replica
// decides against.
//
// # Scripts and keys
//
// Each decision is one atomic Lua script on the master of the counter's
// slot, one per algorithm (package redislayout: lua/*.lua), called as a function of
// one Redis Functions library with FCALL (redislayout.Library), mirroring
// sidecar/limiter/ALGORITHMS.md line by line: the same integers, the same
// rounding, so the Redis store and the in-memory store return the same
// Decision for the same state, instant and cost. The limit's derived
// integers (limiter.Params) travel as ARGV, so the scripts never compute a
// gcd or pick a tick. The clock is Redis TIME; Options.Now, when set (tests
// only), is read for each decision and passed as ARGV instead.
//
// A counter's state is one key, fg:{<space>/<tag>}:<alg>:2 (Keys: the key
// space, a Kubernetes namespace, first in the hash tag, so that a store
// user's ACL key pattern covers its namespace's keys and no other's;
// fg:{<tag>}:<alg>:2 without a space) with <alg> one of tb,
// gcra, fw, sw (a string of 2 to 7 little-endian doubles, struct.pack'd)
// or sl (a sorted set), so every script touches one key and an algorithm
// edit starts afresh, as in memory. (":2" is the state format; the first
// format, hashes, had no suffix, so sidecars of the two versions never
// read each other's state during an upgrade.) The hash tag <tag>
// is Request.Key, which the engine builds as <policy-uid>:<rule>:<hash of
// the descriptor values>; a key that is longer than MaxKeyTag bytes, or
// holds a brace, a space, a control or non-ASCII byte, or starts with '#',
// is replaced by '#' and 128 bits of its SHA-256. So no client string can
// move a counter to another slot or grow a key past MaxRedisKeyLen. Every
// write sets a TTL of limiter.StateTTL(ResetAfter); a deny writes nothing
// (SlidingLog still drops its expired entries, as its pseudocode does),
// and a peek (cost 0) is read-only: it runs no write command at all.
//
// Lua numbers are doubles, exact for integers below 2^53. Requests may
// carry any instant below 2^53 µs, and an instant plus a fill time (up to
// limiter.MaxFillTime) can pass 2^53, so the scripts compute every
// reported duration from differences first ((W - now) + P, not W + P -
// now), and GCRA keeps its theoretical arrival time, the one stored value
// that can pass 2^53 (with a 1µs tick, from the year 2219), as two exact
// parts. TestDifferentialExtremes holds the scripts to package limiter's
// int64 arithmetic at those magnitudes.
//
// # Leases and split counters
//
// Lease (limiter.Leaser) runs the lease entry point of the algorithm's
// script (one per algorithm that can lease; its take is the lease of
// m = n tokens giving back none) on the same key: it
// gives back a lease's unused tokens and takes a batch in one step
// (ALGORITHMS.md section 9). Its reply has seven integers; its call
// discipline is Take's, so a lease call that times out is never sent
// again (its tokens may have been taken: the caller under-admits by at
// most that batch, never over-admits). SplitKey names the sub-counters of
// a split key so that they lie in the middle of equal parts of the slot
// space, and so on different masters of a cluster with equal contiguous
// slot ranges (ALGORITHMS.md section 10).
//
// # Call discipline
//
// Every call has a deadline (Options.Timeout, 50ms by default, or the
// caller's own if earlier) and returns by it, whatever Redis does. The
// store never sends a script twice unless the first answer proves it did
// not run:
//
//   - "Function not found": the node lacks the library (a new node before
//     the manager loaded it, FUNCTION FLUSH); the op is sent once more
//     after FUNCTION LOAD of the library, whose own answer is dropped. A
//     store user that may not load it (a managed store's namespace user)
//     gets the op failed as unavailable instead, naming the library.
//   - MOVED and ASK: the op is sent to the named node (ASK with ASKING), at
//     most twice, and the slot map is reloaded in the background.
//   - A timeout, a refused or dropped connection, or a cancelled caller:
//     the script may have run, so the op fails with an error wrapping
//     limiter.ErrUnavailable and is never resent. Charging twice is worse
//     than failing over to the rule's failure mode.
//
// go-redis retries on its own in ways that could charge twice: a Client
// with MaxRetries >= 0 resends a whole pipeline after a read timeout, EOF,
// or a retryable error on its first command (LOADING, TRYAGAIN,
// CLUSTERDOWN, ...), and a ClusterClient resends commands and pipelines
// after timeouts and EOF up to MaxRedirects times. So the scripts do not
// go through go-redis at all: a ClusterClient only keeps the slot map
// (MasterForKey, ReloadState; MaxRedirects and MaxRetries -1, no ReadOnly,
// RouteRandomly or RouteByLatency), and the store sends to each master
// through its own pipelined connection (below, and package internal/pipe),
// which speaks RESP itself (internal/resp) and never writes a command
// twice. resp.Classify is the one place that reads an error reply's code
// ("Function not found", MOVED, ASK, TRYAGAIN and the other codes of a node that
// cannot serve now), and resp.Redirect the one that reads a redirect's
// target, IPv6 ones included.
//
// Take reports the shard that answered, or failed: the address of a
// master, after any redirect, or UnknownShard when the call fails before
// the slot map names one. The engine keeps its store metrics and its
// fallback state per shard by it.
//
// Every connection, the pipelined ones and the slot map's, is named
// Options.ClientName (CLIENT SETNAME, floodgate-sidecar:<host name> by
// default), so that CLIENT LIST on a node tells whose it is. A node that
// refuses the name is used all the same.
//
// Errors: limiter.ErrUnavailable for anything that leaves the count
// unknown (the shard is unreachable, timed out, its breaker is open, the
// cluster is down for the slot, the node is loading or out of memory, the
// credentials are refused); any other error is a bad request (caught before
// any I/O) or a script failure (an error reply or a malformed reply, every
// element of which is type-checked).
//
// # Circuit breakers
//
// Each master address has a breaker. Options.BreakerFailures consecutive
// unavailable calls open it; while open, decisions for its slots fail at
// once with ErrUnavailable. After a cooldown one probe goes through; its
// success closes the breaker, its failure opens it for another cooldown.
//
// A timeout opens it at once: one call that got no answer within the whole
// call budget (Options.Timeout; a caller's shorter deadline does not count),
// or that waited that long for its connection. A node that made one call
// wait out its budget (stopped, stalled, swapping) would make the calls
// after it wait theirs too. No cooldown then: the next call is the probe,
// and every other call for the node's slots fails fast until the probe's
// outcome is known; the probe answered closes the breaker (a single slow
// answer costs the shard's slots one round trip of fail-fast), the probe
// timed out too opens it for a cooldown. So a stalled shard costs a caller
// at most one call budget, and a sidecar one call per cooldown.
//
// Every caller waits for its call on a timer of its own, set to the call's
// deadline, besides the connection's read deadline: on a busy machine the
// caller then returns as late as any goroutine waking from a sleep, not
// after the connection's reader has also been scheduled.
// Each cooldown is drawn at random between half and one and a half
// Options.BreakerCooldown, so that the sidecars whose breakers opened
// together, when a shard died, probe it at different instants and do not
// all come back in the same millisecond. The breaker reloads the slot map
// in the background when it opens and at each probe, and the calls it
// fails fast ask for a reload at most every 125ms to 375ms (jittered), so
// that after a failover the slots route to the new master, whose breaker
// is closed, within a few hundred milliseconds. A dead shard costs a
// decision one map lookup and one atomic load.
//
// A connection that fails (the node restarted, say) is dialled again after
// a random pause of up to 100ms, for the same reason: every sidecar loses
// its connection to a restarted node at the same instant. A call whose
// deadline comes before the new connection can fails at once. The
// slot-map client (go-redis) retries a node it cannot reach every second
// in the background; from its third failed dial in a row to a node, each
// failure is reported after a random pause of up to a second, so that the
// fleet's retries, which started in the same instant, drift apart.
//
// Redis replicates asynchronously: a replica promoted by a failover may
// lack the last few milliseconds of its master's writes, so counters can
// under-count by what those decisions spent. The store does not WAIT for
// replicas; a rate limiter trades that for latency.
//
// # Micro-batching
//
// Each master gets one pipelined connection: callers queue their
// decisions; a writer goroutine sends what has queued in one write, and a
// reader goroutine reads the answers, which come in command order, and
// hands each to its caller. A connection with no write out sends a
// decision at once (after one scheduler yield, so that callers already
// runnable join it): batching adds no latency at low load. Under load,
// decisions gather while the connection's write is out and leave as soon
// as it is answered (group commit), or when Options.MaxBatch have queued,
// or when Options.BatchWindow has passed since the writer started waiting,
// whichever comes first. The window is a Go timer; it only matters when
// Redis answers slower than the window (and an idle scheduler fires it up
// to about a millisecond late). With BatchWindow 0 the writer neither
// yields nor waits: it writes whatever has queued as soon as it can, so
// only the decisions that queued during its last write share the next. The
// "Function not found", MOVED and ASK answers are handled per decision as
// above.
//
// The connection enforces the call deadlines itself, so the hot path
// creates no context or timer per decision: a decision not answered by its
// deadline fails as unavailable (its late answer is dropped), a connection
// whose every written decision has timed out is closed, and a read or
// write error closes the connection and fails every decision on it,
// written ones as "may have run". None is ever written again.
//
// bench/cmd/floodgate-storebench measures the store against an unbatched
// baseline: one EVALSHA of the same script per decision over a go-redis
// connection pool, and redis-benchmark's FCALL against its EVALSHA.
//
// # What the client does not do
//
// The store is a client for one job, and leaves out what that job does
// not need:
//
//   - RESP2 only: no HELLO, no RESP3, no client-side caching, no pub/sub,
//     no MULTI. The scripts run as Redis 7 Functions (FCALL), so a server
//     before Redis 7, or where FCALL is disabled, renamed or denied by
//     ACL, cannot serve it; EVAL and EVALSHA are not used.
//   - A Redis Cluster, or one standalone server at a fixed address
//     (Options.Single). No Sentinel, no failover of a standalone server,
//     no SELECT (database 0, the only one a cluster has).
//   - Masters only: every call goes to the master of the key's slot; no
//     reads from replicas (the scripts write), no WAIT.
//   - TCP, with or without TLS (Options.TLS, used as given); no Unix
//     domain sockets.
//   - AUTH with a user name and password from Options.Credentials, asked
//     again for each new connection; no other authentication.
//   - Redirects to an IP address, IPv4 or IPv6, or a host name; an
//     endpoint Redis reports as unknown ("?") is not followed, and at most
//     two redirects are followed per decision.
//   - No resend of a script whose outcome is unknown (a timeout, a lost
//     connection), and no retry of TRYAGAIN, CLUSTERDOWN, LOADING or the
//     other answers of a node that cannot serve now: the decision fails as
//     unavailable and its rule falls back to its failure mode.
package redisstore
