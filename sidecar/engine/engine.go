package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// UnavailableRetryAfter is the Retry-After given when a fail-closed rule
// cannot reach the store.
const UnavailableRetryAfter = time.Second

// Options configure an Engine.
type Options struct {
	// Store holds the shared counters. Required.
	Store limiter.Store
	// StoreName labels store metrics ("memory", "redis").
	StoreName string
	// Fallback holds the local fallback buckets. Required.
	Fallback limiter.Store
	// Metrics receives the engine's metrics. Required.
	Metrics *metrics.Metrics
	// DenyCacheKeys bounds the local deny cache; default 100000.
	DenyCacheKeys int
	// Parallel issues a decision's store calls concurrently, which pays
	// off for a remote store.
	Parallel bool
	// Now is the engine's clock, for the deny cache, the latencies and
	// the shards' health; default time.Now. Tests set it to control time.
	// The stores keep clocks of their own.
	Now func() time.Time
	// After, when set, replaces time.NewTimer for the waits of delayed
	// requests (Await), for a simulated clock: it returns a channel that
	// fires after d on that clock. nil uses the runtime's timers.
	After func(d time.Duration) <-chan time.Time
	// Budget, when positive, is the most a decision waits for the store in
	// all, counted from its arrival (the Decide call): its waits in the
	// deny cache for another request's call on a key, and the store calls
	// it makes after them or one after another (several rules), share it
	// (each call carries it as limiter.Request.Deadline). A wait that
	// reaches it falls back like a failed call. Set it to the
	// store's per-call deadline (--redis-timeout), so that a request waits
	// at most one call budget whatever the store does. 0: only each store
	// call's own deadline bounds it.
	Budget time.Duration
	// Leases, when set and Store is a limiter.Leaser, lets the hot keys
	// of rules that lease (Rule.Spread) take leases. Close gives them
	// back.
	Leases *LeaseOptions
	// Log, when set, gets a warning when a store shard starts failing,
	// with the error (a refused password, a certificate the CA bundle does
	// not vouch for, a timeout), and a note when it answers again: at most
	// one of each per shard every shardLogInterval. Nil logs nothing.
	Log *slog.Logger
}

// Engine decides hits. See the package documentation.
type Engine struct {
	o        Options
	deny     *denyCache
	fallback atomic.Bool // some shard's last call found it unavailable
	// downShards counts the shards whose last call failed; fallbackMu
	// serialises its changes with the gauge's.
	downShards int
	fallbackMu sync.Mutex
	nextExpiry atomic.Int64  // Unix nanoseconds of the next expireShards
	all        *shardMetrics // store metrics of an unsharded store
	// shardObs maps a shard to its store metrics. It is copied on write:
	// the shards are few (the store's masters) and read on every store
	// call, where a plain map read costs less than a sync.Map's.
	shardObs atomic.Pointer[map[string]*shardMetrics]
	shardMu  sync.Mutex // serialises the writes of shardObs
	// leases is nil without Options.Leases; splitSeq picks the first
	// sub-counter of split keys in turn.
	leases   *leaseTable
	splitSeq atomic.Uint64
	// realClock: Options.Now is time.Now, so the decision's start is also
	// its arrival for Options.Budget.
	realClock bool
}

// New returns an engine.
func New(o Options) (*Engine, error) {
	if o.Store == nil || o.Fallback == nil || o.Metrics == nil {
		return nil, errors.New("engine: Store, Fallback and Metrics are required")
	}
	if o.StoreName == "" {
		o.StoreName = "store"
	}
	if o.DenyCacheKeys <= 0 {
		o.DenyCacheKeys = 100000
	}
	realClock := o.Now == nil
	if realClock {
		o.Now = time.Now
	}
	if o.Budget < 0 {
		return nil, fmt.Errorf("engine: Budget must not be negative, got %v", o.Budget)
	}
	e := &Engine{o: o, deny: newDenyCache(o.DenyCacheKeys), realClock: realClock}
	e.all = e.shardMetrics("all")
	o.Metrics.SetDenyCacheSize(func() float64 { return float64(e.deny.len()) })
	if leaser, ok := o.Store.(limiter.Leaser); ok && o.Leases != nil {
		lo, err := o.Leases.withDefaults()
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.leases = newLeaseTable(e, lo, leaser)
	}
	return e, nil
}

// ForgetLocalState drops the local deny cache, as after a config change
// that may have raised a limit, and gives back the unused tokens of every
// lease in the background (a lease was taken under the old limits).
// Counters in the stores are kept.
func (e *Engine) ForgetLocalState() {
	e.deny.clear()
	if e.leases != nil {
		e.leases.detach(context.Background(), metrics.ReturnPolicyChange, false)
	}
}
