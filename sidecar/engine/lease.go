package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// LeaseOptions configure the engine's leases: batches of a hot key's
// tokens taken from the store in one call and spent locally (see the
// package documentation). The zero value of every field picks its
// default.
type LeaseOptions struct {
	// MinRate is the local arrival rate, in units of cost per second, at
	// which a key is hot and leased. Default DefaultLeaseMinRate.
	MinRate float64
	// Horizon is how long a lease should last at the key's local rate: a
	// lease holds about rate x Horizon tokens. Default
	// DefaultLeaseHorizon.
	Horizon time.Duration
	// TTL is how long a lease's tokens may be spent after it was taken;
	// then the unused ones go back to the store. FixedWindow and
	// SlidingWindow leases end with their window if it ends first.
	// Default DefaultLeaseTTL.
	TTL time.Duration
	// MaxFraction is the largest share of a key's capacity one lease may
	// hold, in (0, 1]. Default DefaultLeaseMaxFraction.
	MaxFraction float64
	// MaxKeys bounds the keys with lease state. Default
	// DefaultLeaseMaxKeys.
	MaxKeys int
	// SweepInterval is how often expired leases are given back. Default
	// DefaultLeaseSweep; negative starts no sweeper (the owner calls
	// SweepLeases, as a simulation with a clock of its own does).
	SweepInterval time.Duration
}

// Lease defaults.
const (
	DefaultLeaseMinRate     = 50
	DefaultLeaseHorizon     = 50 * time.Millisecond
	DefaultLeaseTTL         = 500 * time.Millisecond
	DefaultLeaseMaxFraction = 0.1
	DefaultLeaseMaxKeys     = 10000
	DefaultLeaseSweep       = 100 * time.Millisecond
)

// rateSlot is the resolution of a key's local arrival rate.
const rateSlot = 100 * time.Millisecond

// returnTimeout bounds a return made outside any request.
const returnTimeout = time.Second

func (o LeaseOptions) withDefaults() (LeaseOptions, error) {
	if o.MinRate == 0 {
		o.MinRate = DefaultLeaseMinRate
	}
	if o.Horizon == 0 {
		o.Horizon = DefaultLeaseHorizon
	}
	if o.TTL == 0 {
		o.TTL = DefaultLeaseTTL
	}
	if o.MaxFraction == 0 {
		o.MaxFraction = DefaultLeaseMaxFraction
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = DefaultLeaseMaxKeys
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultLeaseSweep
	}
	var errs []error
	if o.MinRate < 0 {
		errs = append(errs, fmt.Errorf("lease minRate: must not be negative, got %v", o.MinRate))
	}
	if o.Horizon < 0 || o.TTL < 0 {
		errs = append(errs, fmt.Errorf("lease horizon and ttl: must not be negative, got %v and %v", o.Horizon, o.TTL))
	}
	if o.MaxFraction < 0 || o.MaxFraction > 1 {
		errs = append(errs, fmt.Errorf("lease maxFraction: must be in (0, 1], got %v", o.MaxFraction))
	}
	if o.MaxKeys < 0 {
		errs = append(errs, fmt.Errorf("lease maxKeys: must not be negative, got %d", o.MaxKeys))
	}
	return o, errors.Join(errs...)
}

// leaseTable holds the engine's leases, one entry per hot key, in shards
// that a policy change or shutdown swaps out whole. All methods are safe
// for concurrent use; an entry's fields are guarded by its shard's mutex.
type leaseTable struct {
	e     *Engine
	o     LeaseOptions
	store limiter.Leaser
	cur   atomic.Pointer[leaseShards]
	m     *metrics.Leases

	stop, stopped chan struct{}
	// Background returns: bg counts them until closed, after which returns
	// run on the caller.
	bgMu   sync.Mutex
	bg     sync.WaitGroup
	closed bool
}

type leaseShards struct {
	shards [32]leaseShard
	perMax int
}

type leaseShard struct {
	mu sync.Mutex
	m  map[string]*leaseEntry
	// seen finds hot keys among keys without an entry: a slot counts the
	// arrivals of one key in the current rate slot, and an arrival of
	// another key in the same slot takes one back, so that a key keeps
	// its slot only while it arrives faster than the others that share it.
	seen [64]hotSlot
}

type hotSlot struct {
	hash  uint64
	slot  int64
	count int64
}

// leaseEntry is one hot key's lease and local arrival rate.
type leaseEntry struct {
	s    *leaseShard
	rule *Rule
	// tokens were taken from the store and not spent; they may be spent
	// until expires (Unix nanoseconds, the engine's clock).
	tokens  int64
	expires int64
	// window is the store window the tokens count in (FixedWindow and
	// SlidingWindow), and windowEnd its end as this sidecar estimates it
	// (Unix nanoseconds; 0 when not known).
	window, windowEnd int64
	// sub is the sub-counter of a split key the tokens came from.
	sub int
	// grant is the size of the last grant, for the refresh mark.
	grant int64
	// rtt (nanoseconds) is how long the last lease call took, from the
	// request's start to the store's answer: a refresh must land within
	// what the lease has left by then.
	rtt int64
	// refreshing is set while a request's lease call is out; stale when
	// the rule's limit changed under the entry; dead once the table it is
	// in was swapped out.
	refreshing, stale, dead bool
	// remaining (-1 when unknown) and resetAt (Unix nanoseconds) are the
	// store's last answer, for the response headers of lease hits.
	remaining, resetAt int64
	// quietUntil (Unix nanoseconds) holds off refreshes after one failed,
	// so that a lease is spent, not refreshed, while the store is away.
	quietUntil int64
	// The local arrival rate: cost units in rate slot slot, and in the
	// slot before.
	slot, cur, prev int64
}

func newLeaseTable(e *Engine, o LeaseOptions, store limiter.Leaser) *leaseTable {
	t := &leaseTable{e: e, o: o, store: store, m: e.o.Metrics.Lease}
	t.cur.Store(t.newShards())
	t.m.SetLeaseKeys(func() float64 { return float64(t.len()) })
	if o.SweepInterval > 0 {
		t.stop, t.stopped = make(chan struct{}), make(chan struct{})
		go t.sweeper()
	}
	return t
}

func (t *leaseTable) newShards() *leaseShards {
	ls := &leaseShards{perMax: max(1, t.o.MaxKeys/32)}
	for i := range ls.shards {
		ls.shards[i].m = map[string]*leaseEntry{}
	}
	return ls
}

func (t *leaseTable) len() int {
	n := 0
	ls := t.cur.Load()
	for i := range ls.shards {
		s := &ls.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// hot counts an arrival of cost on the key with hash at n (Unix
// nanoseconds) and reports whether the key arrives at minRate or more.
func (s *leaseShard) hot(hash uint64, n, cost int64, minRate float64) (bool, int64) {
	slot := n / int64(rateSlot)
	h := &s.seen[(hash>>32)%uint64(len(s.seen))]
	switch {
	case h.slot != slot:
		h.hash, h.slot, h.count = hash, slot, cost
	case h.hash == hash:
		h.count += cost
	case h.count > cost:
		h.count -= cost
		return false, 0
	default:
		h.hash, h.count = hash, cost
	}
	return float64(h.count) >= minRate*rateSlot.Seconds(), h.count
}

// observe adds an arrival of cost at n to the entry's rate.
func (ent *leaseEntry) observe(n, cost int64) {
	slot := n / int64(rateSlot)
	switch {
	case slot == ent.slot || slot < ent.slot:
		ent.cur += cost
		return
	case slot == ent.slot+1:
		ent.prev, ent.cur = ent.cur, cost
	default:
		ent.prev, ent.cur = 0, cost
	}
	ent.slot = slot
}

// rate is the entry's local arrival rate at n, in cost units per second:
// the current slot's arrivals plus the part of the previous slot's that a
// sliding window of one slot still covers.
func (ent *leaseEntry) rate(n int64) float64 {
	frac := float64(n-ent.slot*int64(rateSlot)) / float64(rateSlot)
	frac = min(1, max(0, frac))
	return (float64(ent.prev)*(1-frac) + float64(ent.cur)) / rateSlot.Seconds()
}

// refreshMark is the number of tokens below which a lease is refreshed: a
// quarter of the last grant, or what the key spends at rate (per second)
// in two of the last lease call's round trips if that is more, so that
// the refresh lands before the lease runs out even on a slow store.
func (ent *leaseEntry) refreshMark(cost int64, rate float64) int64 {
	return max(cost, ent.grant/4, int64(rate*2*float64(ent.rtt)/float64(time.Second)))
}

// horizon is how long a lease should last at the key's rate: the
// configured horizon, or four of the last lease call's round trips on a
// store slower than that.
func (ent *leaseEntry) horizon(o time.Duration) time.Duration {
	return max(o, 4*time.Duration(ent.rtt))
}

// leaseKind is what a lease lookup found.
type leaseKind uint8

const (
	leaseNone    leaseKind = iota // decide as usual
	leaseHit                      // the cost was spent from the key's lease
	leaseRefresh                  // the request takes a lease (leaseCall)
)

// leaseCall is the lease a request's store call takes when it refreshes
// its key's lease: the most it asks for and what it gives back.
type leaseCall struct {
	entry  *leaseEntry
	want   int64
	ret    int64 // unused tokens of an expired lease, given back first
	window int64 // their window
	sub    int   // the sub-counter to ask first (split keys)
}

// lookup is the lease side of a decision on h at now: it spends h's cost
// from the key's lease (into res), or claims the lease's refresh for this
// request, or leaves the request to the usual path. A peek (cost 0) only
// reads a live lease: it is allowed from it when the lease holds a token
// (as a cost of 1 would be), and otherwise goes to the store; it neither
// counts towards the key's rate nor takes or renews a lease, since a peek
// must change nothing.
func (t *leaseTable) lookup(h *Hit, now time.Time, res *Result) (leaseKind, leaseCall) {
	n := now.UnixNano()
	hash := xxhash.Sum64String(h.Key)
	ls := t.cur.Load()
	s := &ls.shards[hash%uint64(len(ls.shards))]
	s.mu.Lock()
	defer s.mu.Unlock()
	ent := s.m[h.Key]
	if h.Cost == 0 {
		if ent == nil || !sameSpread(ent.rule, h.Rule) || n >= ent.expires || ent.tokens < 1 {
			return leaseNone, leaseCall{}
		}
		h.Rule.lm.Hits.Inc()
		*res = ent.hit(h, n)
		return leaseHit, leaseCall{}
	}
	if ent == nil {
		hot, count := s.hot(hash, n, h.Cost, t.o.MinRate)
		if !hot {
			return leaseNone, leaseCall{}
		}
		if len(s.m) >= ls.perMax && !s.evict(n) {
			return leaseNone, leaseCall{}
		}
		ent = &leaseEntry{s: s, rule: h.Rule, remaining: -1, slot: n / int64(rateSlot), cur: count - h.Cost}
		if sp := h.Rule.split; sp != nil {
			ent.sub = int(t.e.splitSeq.Add(1) % uint64(sp.k))
		}
		s.m[h.Key] = ent
	}
	if ent.rule != h.Rule {
		if !sameSpread(ent.rule, h.Rule) {
			ent.stale = true
			return leaseNone, leaseCall{}
		}
		ent.rule = h.Rule
	}
	ent.observe(n, h.Cost)
	live := n < ent.expires
	if !live && ent.tokens > 0 && !ent.refreshing && lapsed(h.Rule, ent.windowEnd, n) {
		h.Rule.lm.LostTokens.Add(float64(ent.tokens))
		ent.tokens = 0
	}
	if !ent.refreshing && n >= ent.quietUntil {
		rate := ent.rate(n)
		if (!live || ent.tokens < ent.refreshMark(h.Cost, rate)) && rate >= t.o.MinRate {
			want := t.size(h, ent, rate, n)
			if want > h.Cost || (!live && ent.tokens > 0) {
				lc := leaseCall{entry: ent, want: want, window: ent.window, sub: ent.sub}
				if !live && ent.tokens > 0 {
					lc.ret, ent.tokens = ent.tokens, 0
				} else if sp := h.Rule.split; sp != nil {
					lc.sub = (ent.sub + 1) % sp.k
				}
				ent.refreshing = true
				return leaseRefresh, lc
			}
		}
	}
	if live && ent.tokens >= h.Cost {
		ent.tokens -= h.Cost
		h.Rule.lm.Hits.Inc()
		*res = ent.hit(h, n)
		return leaseHit, leaseCall{}
	}
	return leaseNone, leaseCall{}
}

// evict makes room in a full shard: an entry without tokens or a call in
// flight, idle ones first. The caller holds s.mu.
func (s *leaseShard) evict(n int64) bool {
	slot := n / int64(rateSlot)
	var victim string
	found := false
	for k, ent := range s.m {
		if ent.refreshing || ent.tokens > 0 {
			continue
		}
		victim, found = k, true
		if ent.slot < slot-2 {
			break
		}
	}
	if found {
		delete(s.m, victim)
	}
	return found
}

// sameSpread reports whether two rules lease and split alike, so that a
// lease taken under one serves the other (a config reload rebuilds rules).
func sameSpread(a, b *Rule) bool {
	return a.Limit == b.Limit && a.splitK() == b.splitK()
}

// size is the Want of a lease on h's key at local rate: see
// limiter.Params.LeaseSize. A split key is sized on one sub-counter.
func (t *leaseTable) size(h *Hit, ent *leaseEntry, rate float64, n int64) int64 {
	p := h.Rule.params
	if sp := h.Rule.split; sp != nil {
		p = sp.params[ent.sub]
	}
	z := limiter.LeaseSizing{Cost: h.Cost, Rate: rate, Horizon: ent.horizon(t.o.Horizon), MaxFraction: t.o.MaxFraction, Available: ent.remaining}
	if ent.windowEnd > 0 {
		per := p.PeriodMicros * int64(time.Microsecond)
		until := ent.windowEnd - n
		if until <= 0 {
			// Windows are aligned: the next end is a whole number of
			// periods after the last one known.
			until = per - (-until)%per
		}
		z.Until = time.Duration(until)
	}
	return p.LeaseSize(z)
}

// settle records the answer l to a lease call from sub-counter sub, sent
// at sent and answered at answered, and returns how many of the granted
// tokens the lease keeps beyond the request's cost.
func (t *leaseTable) settle(h *Hit, lc *leaseCall, sub int, l limiter.Lease, cost int64, sent, answered time.Time) int64 {
	ent := lc.entry
	lm := h.Rule.lm
	if l.Allowed {
		lm.Granted.Inc()
	} else {
		lm.Denied.Inc()
	}
	lm.GrantedTokens.Add(float64(l.Granted))
	if lc.ret > 0 {
		lm.Renewed.Add(float64(lc.ret))
	}
	extra := l.Granted - min(cost, l.Granted)
	ent.s.mu.Lock()
	defer ent.s.mu.Unlock()
	ent.refreshing = false
	ent.rtt = int64(answered.Sub(sent))
	ent.remaining = l.Remaining
	ent.resetAt = answered.Add(l.ResetAfter).UnixNano()
	if extra == 0 {
		return 0
	}
	if ent.dead {
		// The table was swapped out while the call was out: give the
		// grant back rather than keep it nowhere.
		r := pendingReturn{key: h.Key, rule: h.Rule, tokens: extra, window: l.Window, sub: sub}
		if l.ValidFor > 0 {
			r.windowEnd = sent.Add(l.ValidFor).UnixNano()
		}
		t.spawn(func() { t.giveBack(context.Background(), r, metrics.ReturnPolicyChange, answered) })
		return 0
	}
	if ent.tokens > 0 && l.Window != ent.window {
		// Tokens of a window that has ended lapsed with it.
		lm.LostTokens.Add(float64(ent.tokens))
		ent.tokens = 0
	}
	ttl := t.o.TTL
	if l.ValidFor > 0 {
		// The store's window ends valid-for after its own instant, which
		// came after sent: counting from sent ends the lease no later.
		ttl = min(ttl, l.ValidFor)
		ent.windowEnd = sent.Add(l.ValidFor).UnixNano()
	}
	ent.tokens += extra
	ent.expires = sent.Add(ttl).UnixNano()
	ent.window, ent.sub, ent.grant = l.Window, sub, l.Granted
	return extra
}

// refreshQuiet is how long after a failed refresh a lease is only spent.
const refreshQuiet = 100 * time.Millisecond

// failed records a lease call that got no answer at answered: what it
// gave back may or may not have reached the store. When the lease still
// holds cost tokens, it spends them for the request (into res) and
// reports true: they were paid for, so the request need not fall back.
func (t *leaseTable) failed(h *Hit, lc *leaseCall, cost int64, answered time.Time, res *Result) bool {
	h.Rule.lm.Errors.Inc()
	if lc.ret > 0 {
		h.Rule.lm.LostTokens.Add(float64(lc.ret))
	}
	ent := lc.entry
	ent.s.mu.Lock()
	defer ent.s.mu.Unlock()
	ent.refreshing = false
	n := answered.UnixNano()
	ent.quietUntil = n + int64(refreshQuiet)
	if n >= ent.expires || ent.tokens < cost || ent.dead {
		return false
	}
	ent.tokens -= cost
	h.Rule.lm.Hits.Inc()
	*res = ent.hit(h, n)
	return true
}

// hit is the result of a lease hit at n. The caller holds the shard lock.
func (ent *leaseEntry) hit(h *Hit, n int64) Result {
	c := h.Rule.Limit.Capacity()
	d := limiter.Decision{Allowed: true, Limit: c, Remaining: min(c, ent.tokens+max(0, ent.remaining))}
	if ent.resetAt > n {
		d.ResetAfter = time.Duration(ent.resetAt - n)
	}
	return Result{Decision: d, Source: FromLease, Taken: h.Cost > 0}
}

// release gives up a refresh claimed by a request that sends no store call
// (the deny cache or another rule denied it). The tokens it would have
// given back stay with the entry, for the sweeper.
func (t *leaseTable) release(lc *leaseCall) {
	ent := lc.entry
	if ent == nil {
		return
	}
	ent.s.mu.Lock()
	ent.refreshing = false
	ent.tokens += lc.ret
	ent.s.mu.Unlock()
	lc.entry = nil
}

// unspend puts back the cost of a lease hit whose request another rule
// denied: a rule that does not deny spends nothing on a denied request.
func (t *leaseTable) unspend(h *Hit) {
	hash := xxhash.Sum64String(h.Key)
	ls := t.cur.Load()
	s := &ls.shards[hash%uint64(len(ls.shards))]
	s.mu.Lock()
	if ent := s.m[h.Key]; ent != nil && sameSpread(ent.rule, h.Rule) {
		ent.tokens += h.Cost
	}
	s.mu.Unlock()
}

// pendingReturn is a lease's unused tokens on their way back.
type pendingReturn struct {
	key       string
	rule      *Rule
	tokens    int64
	window    int64
	windowEnd int64
	sub       int
}

// take removes the entry's unused tokens for a return. The caller holds
// the entry's shard lock.
func (ent *leaseEntry) take(key string) pendingReturn {
	r := pendingReturn{key: key, rule: ent.rule, tokens: ent.tokens, window: ent.window, windowEnd: ent.windowEnd, sub: ent.sub}
	ent.tokens = 0
	return r
}

// lapsed reports whether tokens counted in a window that ends at
// windowEnd (Unix nanoseconds; 0 for the buckets) can no longer go back at
// n: a FixedWindow window has ended, a SlidingWindow one no longer weighs
// on the estimate as the previous window.
func lapsed(r *Rule, windowEnd, n int64) bool {
	if windowEnd == 0 {
		return false
	}
	if r.Limit.Algorithm == limiter.SlidingWindow {
		windowEnd += r.Limit.Period.Nanoseconds()
	}
	return n >= windowEnd
}

// giveBack returns r's tokens to the store at now, for reason, unless the
// window they counted in has ended (then they lapsed with it).
func (t *leaseTable) giveBack(ctx context.Context, r pendingReturn, reason string, now time.Time) {
	lm := r.rule.lm
	if lapsed(r.rule, r.windowEnd, now.UnixNano()) {
		lm.LostTokens.Add(float64(r.tokens))
		return
	}
	key, lim := r.key, r.rule.Limit
	if sp := r.rule.split; sp != nil {
		key, lim = t.e.subKey(r.key, r.sub, sp.k), sp.limits[r.sub]
	}
	ctx, cancel := context.WithTimeout(ctx, returnTimeout)
	defer cancel()
	_, shard, err := t.store.Lease(ctx, limiter.LeaseRequest{Key: key, Limit: lim, LeaseArgs: limiter.LeaseArgs{Return: r.tokens, Window: r.window}})
	answered := t.e.o.Now()
	sm := t.e.observeStore(shard, now, answered)
	if err != nil {
		t.e.countStoreFailure(sm, err, answered)
		lm.Errors.Inc()
		lm.LostTokens.Add(float64(r.tokens))
		return
	}
	sm.ok.Inc()
	t.e.markShard(sm, false, answered)
	lm.Returned(reason).Add(float64(r.tokens))
}

// spawn runs f in the background, or on the caller once the table is
// closed.
func (t *leaseTable) spawn(f func()) {
	t.bgMu.Lock()
	if t.closed {
		t.bgMu.Unlock()
		f()
		return
	}
	t.bg.Add(1)
	t.bgMu.Unlock()
	go func() {
		defer t.bg.Done()
		f()
	}()
}

// sweep gives back the unused tokens of the leases that have expired (or
// whose rule changed), and forgets the keys that went quiet.
func (t *leaseTable) sweep(ctx context.Context, now time.Time) {
	n := now.UnixNano()
	idle := n/int64(rateSlot) - 2
	var out []pendingReturn
	ls := t.cur.Load()
	for i := range ls.shards {
		s := &ls.shards[i]
		s.mu.Lock()
		for key, ent := range s.m {
			if ent.refreshing {
				continue
			}
			if ent.tokens > 0 && (n >= ent.expires || ent.stale) {
				out = append(out, ent.take(key))
			}
			if ent.tokens == 0 && (ent.stale || ent.slot < idle) {
				delete(s.m, key)
			}
		}
		s.mu.Unlock()
	}
	for _, r := range out {
		t.giveBack(ctx, r, metrics.ReturnExpiry, now)
	}
}

func (t *leaseTable) sweeper() {
	defer close(t.stopped)
	tick := time.NewTicker(t.o.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.sweep(context.Background(), t.e.o.Now())
		}
	}
}

// detach swaps in an empty table and gives back every unused token of the
// old one, for reason: on a policy change in the background, at shutdown
// on the caller (bounded by ctx).
func (t *leaseTable) detach(ctx context.Context, reason string, wait bool) {
	old := t.cur.Swap(t.newShards())
	var out []pendingReturn
	for i := range old.shards {
		s := &old.shards[i]
		s.mu.Lock()
		for key, ent := range s.m {
			ent.dead = true
			if ent.tokens > 0 && !ent.refreshing {
				out = append(out, ent.take(key))
			}
		}
		s.mu.Unlock()
	}
	if len(out) == 0 {
		return
	}
	run := func() {
		now := t.e.o.Now()
		for _, r := range out {
			t.giveBack(ctx, r, reason, now)
		}
	}
	if wait {
		run()
		return
	}
	t.spawn(run)
}

// close stops the sweeper, gives back every lease and waits, within ctx,
// for the returns in the background.
func (t *leaseTable) close(ctx context.Context) error {
	if t.stop != nil {
		select {
		case <-t.stop:
		default:
			close(t.stop)
			<-t.stopped
		}
	}
	t.bgMu.Lock()
	t.closed = true
	t.bgMu.Unlock()
	t.detach(ctx, metrics.ReturnShutdown, true)
	done := make(chan struct{})
	go func() { t.bg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("returning leases: %w", ctx.Err())
	}
}

// SweepLeases gives back now the unused tokens of the leases that have
// expired, as the background sweep does every LeaseOptions.SweepInterval,
// and forgets the keys that went quiet. It is for an owner that runs the
// engine on a clock of its own (LeaseOptions.SweepInterval < 0).
func (e *Engine) SweepLeases(ctx context.Context) {
	if e.leases != nil {
		e.leases.sweep(ctx, e.o.Now())
	}
}

// Close gives back the unused tokens of every lease, waiting for the
// returns until ctx ends, and stops the lease sweeper. Decisions after
// Close take no more leases only if the owner stops sending them; it is
// meant for shutdown, after the last request has drained. An engine
// without leases has nothing to close.
func (e *Engine) Close(ctx context.Context) error {
	if e.leases == nil {
		return nil
	}
	return e.leases.close(ctx)
}

// takeLease makes a lease call for c, which refreshes its key's lease,
// and maintains the lease, the deny cache and the store metrics as take
// does.
func (e *Engine) takeLease(ctx context.Context, h *Hit, c *call, now time.Time) {
	lc := &c.lease
	l, shard, err := e.leases.store.Lease(ctx, limiter.LeaseRequest{Key: h.Key, Limit: h.Rule.Limit,
		LeaseArgs: limiter.LeaseArgs{Cost: c.cost, Want: lc.want, Return: lc.ret, Window: lc.window}, Deadline: c.deadline})
	answered := e.o.Now()
	sm := e.observeStore(shard, now, answered)
	if err != nil {
		if e.leases.failed(h, lc, c.cost, answered, &c.res) {
			// Spent from the lease: the failure still counts, and the
			// key's waiters are let go.
			e.countStoreFailure(sm, err, answered)
			if c.entry != nil {
				e.deny.settle(h.Key, c.entry, now, answer{failed: true})
				c.entry = nil
			}
			return
		}
		e.storeFailed(ctx, h, c, sm, err, now, answered)
		return
	}
	sm.ok.Inc()
	e.markShard(sm, false, answered)
	extra := e.leases.settle(h, lc, 0, l, c.cost, now, answered)
	d := l.Decision
	d.Remaining = min(d.Limit, d.Remaining+extra)
	c.res = Result{Decision: d, Source: FromStore, Taken: d.Allowed && c.cost > 0}
	e.remember(h, c, l.Decision, answered)
}

// observeStore returns the metrics of shard and observes the latency of a
// store call made at now and answered at answered.
func (e *Engine) observeStore(shard string, now, answered time.Time) *shardMetrics {
	sm := e.all
	if shard != "" {
		sm = e.shardMetrics(shard)
	}
	sm.obs.Observe(answered.Sub(now).Seconds())
	return sm
}

// countStoreFailure counts a failed store call and marks its shard down,
// logging why when the shard was up.
func (e *Engine) countStoreFailure(sm *shardMetrics, err error, answered time.Time) {
	if errors.Is(err, limiter.ErrUnavailable) {
		sm.unav.Inc()
	} else {
		// Any other error also leaves the shared count unknown.
		sm.error.Inc()
	}
	if !sm.down.Load() && e.o.Log != nil && sm.logFailure(answered) {
		e.o.Log.Warn("a store shard fails; the keys on it follow each rule's failure mode until it answers",
			"store", e.o.StoreName, "shard", sm.name, "error", err.Error())
	}
	e.markShard(sm, true, answered)
}

// storeFailed decides c, whose store call failed, by its rule's failure
// mode, as take does.
func (e *Engine) storeFailed(ctx context.Context, h *Hit, c *call, sm *shardMetrics, err error, now, answered time.Time) {
	e.countStoreFailure(sm, err, answered)
	e.storeFailedCounted(ctx, h, c, err, now)
}

// unspendDenied puts back the lease hits of a request that another rule
// denied (or found the store unavailable for): only the denying rule
// decides such a request, and the others spend nothing. Shadow rules keep
// what they spent, as they do on the store.
func (e *Engine) unspendDenied(hits []Hit, v *Verdict) {
	if e.leases == nil {
		return
	}
	denied := false
	for i, r := range v.Results {
		if !hits[i].Rule.Shadow && r.Source != NotEvaluated && (!r.Allowed || r.Source == FromNowhere) {
			denied = true
			break
		}
	}
	if !denied {
		return
	}
	for i := range v.Results {
		if r := &v.Results[i]; r.Source == FromLease && !hits[i].Rule.Shadow {
			e.leases.unspend(&hits[i])
			*r = Result{}
		}
	}
}
