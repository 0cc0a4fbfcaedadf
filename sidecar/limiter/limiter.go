package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Algorithm names a limiting algorithm.
type Algorithm uint8

// The algorithms floodgate implements. The zero value is invalid so that a
// forgotten field is caught by Limit.Validate.
const (
	// TokenBucket refills continuously at Requests per Period up to a
	// capacity of Burst (or Requests when Burst is 0).
	TokenBucket Algorithm = iota + 1
	// GCRA is the generic cell rate algorithm with redis-cell's CL.THROTTLE
	// semantics.
	GCRA
	// SlidingWindow is the sliding-window counter: the previous window's
	// count weighted by its overlap with the sliding window.
	SlidingWindow
	// FixedWindow counts in windows aligned to the Unix epoch.
	FixedWindow
	// SlidingLog keeps an exact log of admitted request timestamps.
	SlidingLog
)

var algorithmNames = [...]string{
	TokenBucket:   "TokenBucket",
	GCRA:          "GCRA",
	SlidingWindow: "SlidingWindow",
	FixedWindow:   "FixedWindow",
	SlidingLog:    "SlidingLog",
}

// String returns the algorithm's name as written in policies.
func (a Algorithm) String() string {
	if a == 0 || int(a) >= len(algorithmNames) {
		return fmt.Sprintf("Algorithm(%d)", uint8(a))
	}
	return algorithmNames[a]
}

// ParseAlgorithm returns the algorithm with the given policy name.
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, name := range algorithmNames {
		if i > 0 && name == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q: want one of TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog", s)
}

// Bounds on a Limit. They keep every computation free of integer overflow
// and exact in the Lua scripts, whose numbers are IEEE doubles (see
// ALGORITHMS.md, section 7).
const (
	MinPeriod   = time.Second
	MaxPeriod   = 366 * 24 * time.Hour
	MaxRequests = 1_000_000_000
	// MaxLogRequests bounds Requests for SlidingLog, whose state holds one
	// entry per admitted request in the window.
	MaxLogRequests = 100_000
	// MaxFillTime bounds how long an empty TokenBucket or GCRA bucket takes
	// to refill (Capacity * Period / Requests).
	MaxFillTime = 100 * MaxPeriod
)

// Limit is one rule's limit: Requests per Period, shaped by Algorithm.
type Limit struct {
	Algorithm Algorithm
	// Requests is the number of requests admitted per Period. It sets the
	// rate for TokenBucket and GCRA and the window count for the window
	// algorithms.
	Requests int64
	// Period is the window length, or the time over which Requests tokens
	// refill.
	Period time.Duration
	// Burst is the bucket capacity for TokenBucket and GCRA: how many
	// requests a client that has been idle may send at once. 0 means
	// Requests. The window algorithms reject a non-zero Burst.
	Burst int64
	// Share, when Share.Of > 1, makes this one replica's share of the
	// limit, for replicas that enforce it together without a shared store
	// (the fail-open fallback). See Share. Only the in-memory store takes
	// a shared limit.
	Share Share
	// MaxDelay, when positive, makes a GCRA limit delay instead of deny
	// (a rule's onExceed: Delay): a request over the limit whose slot
	// comes within MaxDelay is admitted with Decision.Wait, its slot
	// reserved at once so that later requests queue behind it; past
	// MaxDelay it is denied, and reserves nothing. Capacity is then how
	// many requests an idle key passes at once. Only GCRA, never shared,
	// at most MaxMaxDelay, a whole number of microseconds (ALGORITHMS.md
	// section 10).
	MaxDelay time.Duration
}

// MaxMaxDelay bounds Limit.MaxDelay: a request waits in the sidecar, with
// its connection open, for at most this long.
const MaxMaxDelay = time.Minute

// MaxShareReplicas bounds Share.Of.
const MaxShareReplicas = 100_000

// Share places one replica among Of replicas that enforce a limit
// together, each deciding alone: the fail-open fallback while the shared
// store is unreachable.
//
// Whatever the algorithm, a shared limit is a token bucket of the limit's
// capacity (Burst, or Requests) refilled at Requests per Period, dealt out
// to the replicas: token j (the j-th of the limit's tokens since the Unix
// epoch, arriving at j*Period/Requests) belongs to replica j mod Of, and
// stays usable while it is one of the newest Capacity tokens. So no two
// replicas ever spend the same token: together the replicas admit at most
// what one bucket of the whole limit admits, for every Requests and Of,
// including Requests < Of, where most replicas hold no token most of the
// time. A key is empty when a replica first sees it, so the fleet does not
// add a fresh burst to what the shared store had already counted.
//
// Each replica must have its own Index in [0, Of); two replicas with one
// index spend the same tokens, each once, which still holds the limit over
// a whole period but lets them admit at the same instants. One replica
// holds at most ceil(Capacity/Of) tokens at once, reported as
// Decision.Limit.
//
// A share's state is the token index from which the replica may still
// spend, so it reads the same under another Of or Index: a replica count
// that changes keeps what was spent.
type Share struct {
	// Of is the number of replicas; 0 or 1 means the whole limit.
	Of int32
	// Index is this replica, 0 to Of-1.
	Index int32
}

// Shared reports whether l is a replica's share of a limit.
func (l Limit) Shared() bool { return l.Share.Of > 1 }

// Capacity returns the most cost a single key can spend at once.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Validate reports every problem with l at once.
func (l Limit) Validate() error {
	var errs []error
	if l.Algorithm == 0 || int(l.Algorithm) >= len(algorithmNames) {
		errs = append(errs, fmt.Errorf("algorithm: unknown algorithm %d", l.Algorithm))
	}
	if l.Requests <= 0 || l.Requests > MaxRequests {
		errs = append(errs, fmt.Errorf("requests: must be between 1 and %d, got %d", MaxRequests, l.Requests))
	}
	if l.Period < MinPeriod || l.Period > MaxPeriod {
		errs = append(errs, fmt.Errorf("per: must be between %v and %v, got %v", MinPeriod, MaxPeriod, l.Period))
	} else if l.Period%time.Microsecond != 0 {
		errs = append(errs, fmt.Errorf("per: must be a whole number of microseconds, got %v", l.Period))
	}
	if l.Burst < 0 || l.Burst > MaxRequests {
		errs = append(errs, fmt.Errorf("burst: must be between 0 and %d, got %d", MaxRequests, l.Burst))
	}
	if l.Share.Of < 0 || l.Share.Of > MaxShareReplicas {
		errs = append(errs, fmt.Errorf("share: replicas must be between 0 and %d, got %d", MaxShareReplicas, l.Share.Of))
	} else if l.Share.Index < 0 || l.Share.Index >= max(l.Share.Of, 1) {
		errs = append(errs, fmt.Errorf("share: index must be between 0 and %d, got %d", max(l.Share.Of, 1)-1, l.Share.Index))
	}
	switch {
	case l.MaxDelay < 0 || l.MaxDelay > MaxMaxDelay:
		errs = append(errs, fmt.Errorf("maxDelay: must be between 0 and %v, got %v", MaxMaxDelay, l.MaxDelay))
	case l.MaxDelay%time.Microsecond != 0:
		errs = append(errs, fmt.Errorf("maxDelay: must be a whole number of microseconds, got %v", l.MaxDelay))
	case l.MaxDelay > 0 && l.Algorithm != GCRA:
		errs = append(errs, fmt.Errorf("maxDelay: only GCRA delays requests, not %v", l.Algorithm))
	case l.MaxDelay > 0 && l.Share.Of > 1:
		errs = append(errs, errors.New("maxDelay: a shared limit (the fail-open fallback) does not delay"))
	}
	switch l.Algorithm {
	case SlidingWindow, FixedWindow, SlidingLog:
		if l.Burst != 0 {
			errs = append(errs, fmt.Errorf("burst: only TokenBucket and GCRA take a burst, %v counts Requests per Period", l.Algorithm))
		}
	}
	if len(errs) == 0 {
		// The checks below need the field bounds above to hold.
		if l.Algorithm == SlidingLog && l.Requests > MaxLogRequests {
			errs = append(errs, fmt.Errorf("requests: SlidingLog keeps one entry per admitted request, so it takes at most %d, got %d; use SlidingWindow for larger limits", MaxLogRequests, l.Requests))
		}
		if err := l.checkScale(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Decision is the answer for one request of some cost against one key.
type Decision struct {
	// Allowed reports whether the request is admitted. A denied request
	// spends nothing.
	Allowed bool
	// Limit is the key's capacity (Limit.Capacity).
	Limit int64
	// Remaining is what the key may still spend now, after this request.
	Remaining int64
	// ResetAfter is how long until the key is back to full capacity.
	ResetAfter time.Duration
	// RetryAfter is how long until the same request would be admitted. It
	// is 0 when Allowed, and at least one microsecond when denied. Under a
	// Limit with MaxDelay it is how long until the request would be
	// admitted with a Wait of at most MaxDelay.
	RetryAfter time.Duration
	// Wait, under a Limit with MaxDelay, is how long an admitted request
	// waits for its reserved slot before it goes on; 0 otherwise.
	Wait time.Duration
}

// Request is one decision asked of a Store.
type Request struct {
	// Key is the counter identity: rule identity plus the hash of the
	// descriptor values. It never holds raw client-supplied strings.
	Key string
	// Limit is the limit to apply. Changing it between calls keeps the
	// key's state, so counters survive limit edits.
	Limit Limit
	// Cost is what the request spends. 0 is a peek: decided as a cost of
	// 1 (is one unit left?), it spends nothing and writes nothing.
	Cost int64
	// Deadline, when set, is when the caller stops waiting for the answer:
	// the deadline of the whole decision, set from the request's arrival.
	// A remote store answers (or fails) by the earlier of it and its own
	// per-call budget; a local store, which never waits, ignores it.
	Deadline time.Time
}

// ErrUnavailable marks a store error after which the caller cannot know the
// shared count: the store is unreachable, timed out, or its circuit breaker
// is open. Rules fall back to their failure mode on it. Stores wrap it with
// %w so that errors.Is finds it.
var ErrUnavailable = errors.New("counter store unavailable")

// Store decides requests against keyed limiter state, at the instant its
// own clock gives (the in-memory store's clock, Redis TIME); tests inject
// a clock through the store's options. Implementations are safe for
// concurrent use.
type Store interface {
	// Take applies req atomically and returns the decision, and the shard
	// of the store that holds req.Key: the name its metrics and health
	// are kept under, such as a Redis master's address. The shard is ""
	// for a store that is not sharded, or when a call fails before the
	// key's shard is known; it comes with errors too, so that a failing
	// shard can be told from a healthy one. An error wrapping
	// ErrUnavailable means the state could not be reached.
	Take(ctx context.Context, req Request) (d Decision, shard string, err error)
}

// String formats d compactly, for logs and test failures.
func (d Decision) String() string {
	verdict := "deny"
	if d.Allowed {
		verdict = "allow"
	}
	if d.Wait > 0 {
		verdict += fmt.Sprintf(" wait=%v", d.Wait)
	}
	return fmt.Sprintf("{%s limit=%d remaining=%d reset=%v retry=%v}", verdict, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter)
}
