// Package engine is floodgate-sidecar's decision engine. It is transport
// neutral: a front end (the HTTP proxy, sidecar/proxy, or the Envoy
// rate-limit service, sidecar/envoyrls) matches a request to rules and
// computes their counter keys, and the engine decides the resulting hits
// against the counter store.
//
// # Semantics
//
// Every hit is checked and the tightest wins: if any enforced rule denies,
// the request is denied. A rule that denies takes no tokens. Shadow rules
// are counted and reported as if each were the only rule, but never change
// the outcome. The headers describe one hit, the binding one: the denying
// rule with the longest wait, or else the enforced rule with least
// remaining, a rule that is not Quiet before a Quiet one: a rule whose
// answers keep its numbers hidden never binds an admitted request that a
// rule showing its numbers also matched, so the presence and values of
// that rule's fields say nothing of the hidden rule's count.
//
// A hit of cost 0 (the Envoy front's hits_addend 0: "is at least one
// unit left?") is a peek, decided as a cost of 1 would be and never
// spending: the store decides it so (limiter.Request.Cost), the deny
// cache denies it while it holds the key, and a lease answers it while
// the lease holds a token, but a peek never takes, renews or counts
// towards a lease.
//
// # Multi-rule atomicity
//
// The Store interface is one key per call, and keys of different rules may
// live on different Redis shards, so a decision over several rules cannot be
// one atomic script. With one enforced hit (the common case) the engine
// makes exactly one Take. With several it first peeks every rule (a Take of
// cost 0, which never writes), denies without taking anything if a peek
// shows a rule short, and otherwise takes every rule. Between the peeks and
// the takes other requests (from this or other replicas) may spend the same
// counters; if one of the takes is then denied, the takes that succeeded
// have been charged for a request that is denied. That race window is the
// length of one store round trip, and it can only over-charge (never
// over-admit) by at most one request's cost per rule per raced request. A
// single-rule decision has no such window.
//
// # Local deny cache
//
// A key the store has denied is denied locally until its RetryAfter, and a
// key that an allowed decision left empty is denied locally until the
// earliest instant it could admit again (exact for TokenBucket, GCRA and
// FixedWindow; the other algorithms are only cached after a deny). When the
// entry expires it keeps gating the key: as many requests go to the store
// at once as the store last said the key had left, and when that is none,
// one probe goes while the others wait for its answer, so a burst of
// concurrent requests on an exhausted key cannot all reach the store. When
// that answer is a failure (the shard is unavailable), the waiters share
// it: they follow the rule's failure mode at once instead of sending calls
// of their own one after the other. With Options.Budget, a decision's
// deadline is set once from its arrival: its waits end at it (falling back
// as on a failure) and its store calls carry it (limiter.Request.Deadline),
// so no request waits for the store longer than one budget in all. When
// several replicas share a flooded key, their
// probes race for each token and the losers are denied; a replica's
// consecutive denials double its local hold up to MaxDenyBackoff, so a
// losing replica probes about once a second while the winners keep spending
// the key's full limit. A hot key flooded far beyond its limit therefore
// costs the store about one call per admitted request plus one probe per
// replica per second.
//
// # Leases
//
// With Options.Leases and a store that can lease (limiter.Leaser), a key
// whose local arrival rate reaches LeaseOptions.MinRate on a rule that
// leases (Rule.Spread) is decided on a lease: one request's store call
// takes a batch of the key's tokens (limiter.Params.LeaseSize: about
// rate x Horizon, at most MaxFraction of the capacity, at most this
// sidecar's share of what the key has left), and the next requests spend
// them without a store call (Source FromLease). The request that finds a
// quarter of the last grant or less left, or an expired lease, refreshes
// it; the others go on spending what is left meanwhile, and a request
// that finds too little and a refresh out decides as without a lease.
// Every token is taken from the shared count before it is spent, so the
// fleet never admits more than the limit over a key's life; in any
// interval it admits at most what the key alone would plus what the
// leases held at the interval's start. A lease lives LeaseOptions.TTL, or
// to the end of its window for FixedWindow and SlidingWindow, whose tokens
// count in one window only; its unused tokens then go back (the sweep, or
// the refresh that follows), as they do on a policy change
// (ForgetLocalState) and at shutdown (Close). A lease hit of a request that
// another rule denies is put back. While the store is unreachable, a lease
// is still spent until it runs out or expires (its tokens were paid for);
// then each rule follows its failure mode, and the tokens that could not go
// back are counted lost. SlidingLog never leases (limiter.Algorithm.
// Leasable says why).
//
// # Split counters
//
// A rule spread over k sub-counters (Rule.Spread, limiter.SplitLimit)
// decides each request, or lease, on one sub-counter, taken in turn, and
// when that one denies borrows from the next ones; it denies only when all
// deny, with the shortest wait. The sub-counters' keys come from the store
// (limiter.Splitter: the Redis store puts them on different masters). A
// split decision falls back to the failure mode only when no sub-counter
// answered: while some are reachable, the rule keeps their share of its
// limit.
//
// # Failure modes
//
// When the store is unavailable (its error wraps limiter.ErrUnavailable, as
// it does when the Redis breaker is open), a rule with FailClosed makes the
// outcome Unavailable (the HTTP front answers 503), and any other rule is
// decided on this replica's share of the limit (limiter.Share): the limit's
// tokens dealt out to the replicas, so that the replicas together admit
// at most the limit whatever the replica count, even when it is larger
// than the limit. A key starts empty on the fallback, so an outage adds
// no fresh burst to what the store had counted.
//
// An Engine is safe for concurrent use.
package engine
