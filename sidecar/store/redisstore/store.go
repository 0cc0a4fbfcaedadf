package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

var _ limiter.Store = (*Store)(nil)

// maxRedirects bounds how many MOVED or ASK hops one decision follows.
const maxRedirects = 2

// paramsCacheSize bounds the cache of derived limit parameters.
const paramsCacheSize = 4096

// Store is a limiter.Store on a Redis Cluster (or one standalone server).
// Every decision is one atomic Lua script on the master of the counter's
// slot. See the package documentation for the call discipline. A Store is
// safe for concurrent use.
type Store struct {
	opts Options
	cc   *redis.ClusterClient // slot map only; nil in single mode
	// route guards topology lookups: when no node can tell the slot map,
	// it fails decisions fast like a shard breaker.
	route *breaker

	mu     sync.Mutex
	shards atomic.Pointer[map[string]*shard] // copy on write under mu

	pmu    sync.Mutex
	params map[limiter.Limit]*limitArgs

	// The first slot-map load is shared by the callers that arrive before
	// it ends, instead of each loading it (go-redis would).
	loadMu   sync.Mutex
	loaded   atomic.Bool
	inflight *slotLoad

	closed atomic.Bool
}

// slotLoad is one slot-map load in flight.
type slotLoad struct {
	done chan struct{}
	err  error
}

// New returns a Store. It does not connect: a store whose Redis is down
// starts, and its decisions fail with limiter.ErrUnavailable until Redis
// answers.
func New(opts Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	o.Addrs = append([]string(nil), o.Addrs...)
	s := &Store{
		opts:   o,
		route:  newBreaker(o.BreakerFailures, o.BreakerCooldown, time.Now, nil),
		params: map[limiter.Limit]*limitArgs{},
	}
	empty := map[string]*shard{}
	s.shards.Store(&empty)
	if !o.Single {
		s.cc = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:               o.Addrs,
			CredentialsProvider: o.Credentials,
			TLSConfig:           cloneTLS(o.TLS),
			Protocol:            2,
			// The cluster client only loads the slot map (CLUSTER
			// SLOTS); the scripts go through the store's own pipelined
			// connections. Still, nothing in it may retry.
			MaxRedirects:          -1,
			MaxRetries:            -1,
			DialTimeout:           o.DialTimeout,
			DialerRetries:         1,
			ReadTimeout:           time.Second,
			WriteTimeout:          time.Second,
			ContextTimeoutEnabled: true,
			PoolSize:              2,
			DisableIdentity:       true,
			// A connection that is not authenticated when the node
			// wants it to be is refused here (checkAuth) rather than
			// pooled. The name is a courtesy to whoever reads CLIENT
			// LIST: a node that refuses it (ACLs) still serves the slot
			// map, where go-redis's own ClientName would fail the
			// connection.
			OnConnect: func(ctx context.Context, cn *redis.Conn) error {
				if err := checkAuth(ctx, cn); err != nil {
					return err
				}
				_ = cn.ClientSetName(ctx, o.ClientName).Err()
				return nil
			},
			ClusterStateReloadInterval: 5 * time.Second,
			MaintNotificationsConfig:   &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		// Start loading the slot map now; the first decisions wait for
		// this load instead of starting their own.
		go func() { _ = s.loadSlots(context.Background()) }()
	}
	return s, nil
}

func cloneTLS(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	return c.Clone()
}

// checkAuth sends PING on a new connection of the slot map's client, so
// that a node that wants a password the connection did not send refuses
// it (NOAUTH) before it enters the pool. go-redis keeps a connection after
// a server error, so one dialled before the password existed (a sidecar
// that starts before the kubelet fills its optional Secret volume) would
// otherwise fail every later call, even once the password is there.
func checkAuth(ctx context.Context, cn *redis.Conn) error { return cn.Ping(ctx).Err() }

// Close closes every connection. Decisions after Close fail with
// limiter.ErrUnavailable.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range *s.shards.Load() {
		sh.close()
	}
	if s.cc != nil {
		if err := s.cc.Close(); err != nil {
			return fmt.Errorf("redisstore: close the slot map's client: %w", err)
		}
	}
	return nil
}

// ShardState is one shard's address and breaker state.
type ShardState struct {
	Addr    string
	Breaker BreakerState
}

// Shards returns the shards the store has talked to, sorted by address,
// with their breaker states.
func (s *Store) Shards() []ShardState {
	m := *s.shards.Load()
	out := make([]ShardState, 0, len(m))
	for addr, sh := range m {
		out = append(out, ShardState{Addr: addr, Breaker: sh.br.State()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// PipelineStats counts the pipelined writes of a store.
type PipelineStats struct {
	// Writes is how many pipelined writes went out.
	Writes int64
	// Decisions is how many decisions they carried (resends after NOSCRIPT
	// or a redirect included). Decisions / Writes is the mean batch.
	Decisions int64
}

// PipelineStats returns the pipelined writes so far, over every shard.
func (s *Store) PipelineStats() PipelineStats {
	var st PipelineStats
	for _, sh := range *s.shards.Load() {
		st.Writes += sh.stats.Writes.Load()
		st.Decisions += sh.stats.Calls.Load()
	}
	return st
}

// shard returns the shard for a node address, creating it on first use.
func (s *Store) shard(addr string) *shard {
	if sh, ok := (*s.shards.Load())[addr]; ok {
		return sh
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := *s.shards.Load()
	if sh, ok := m[addr]; ok {
		return sh
	}
	sh := newShard(s, addr)
	next := make(map[string]*shard, len(m)+1)
	for k, v := range m {
		next[k] = v
	}
	next[addr] = sh
	s.shards.Store(&next)
	return sh
}

// shardFor returns the shard of the master that holds key's slot.
func (s *Store) shardFor(ctx context.Context, deadline time.Time, key string) (*shard, error) {
	if s.opts.Single {
		return s.shard(s.opts.Addrs[0]), nil
	}
	ok, probe := s.route.allow()
	if !ok {
		return nil, unavailable("cluster", errors.New("no node answers with the slot map; failing fast"))
	}
	if !s.loaded.Load() {
		lctx, cancel := context.WithDeadline(ctx, deadline)
		err := s.loadSlots(lctx)
		cancel()
		if err != nil {
			s.route.failure(probe, 1)
			return nil, unavailable("cluster", fmt.Errorf("slot map: %w", err))
		}
	}
	c, err := s.cc.MasterForKey(ctx, key)
	if err != nil {
		s.route.failure(probe, 1)
		return nil, unavailable("cluster", fmt.Errorf("slot map: %w", err))
	}
	s.route.success(probe)
	return s.shard(c.Options().Addr), nil
}

// slotLoadTimeout bounds one background load of the slot map.
const slotLoadTimeout = 5 * time.Second

// loadSlots waits, at most until ctx ends, for the first slot map. One
// load runs at a time, under its own timeout, so that it completes for the
// callers that come later even when the first caller gives up.
func (s *Store) loadSlots(ctx context.Context) error {
	s.loadMu.Lock()
	if s.loaded.Load() {
		s.loadMu.Unlock()
		return nil
	}
	l := s.inflight
	if l == nil {
		l = &slotLoad{done: make(chan struct{})}
		s.inflight = l
		go func() {
			lctx, cancel := context.WithTimeout(context.Background(), slotLoadTimeout)
			defer cancel()
			// MasterForKey loads the whole map when there is none.
			_, err := s.cc.MasterForKey(lctx, "fg:{}")
			s.loadMu.Lock()
			l.err = err
			if err == nil {
				s.loaded.Store(true)
			}
			s.inflight = nil
			s.loadMu.Unlock()
			close(l.done)
		}()
	}
	s.loadMu.Unlock()
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reloadTopology asks the cluster client to reload the slot map in the
// background. Concurrent requests coalesce into one reload at a time, at
// most one per 200ms.
func (s *Store) reloadTopology() {
	if s.cc != nil && !s.closed.Load() {
		s.cc.ReloadState(context.Background())
	}
}

// limitArgs returns the validated parameters of l with its script and
// constant arguments, cached.
func (s *Store) limitArgs(l limiter.Limit) (*limitArgs, error) {
	s.pmu.Lock()
	la, ok := s.params[l]
	s.pmu.Unlock()
	if ok {
		return la, nil
	}
	p, err := limiter.NewParams(l)
	if err != nil {
		return nil, err
	}
	la = newLimitArgs(p)
	s.pmu.Lock()
	if len(s.params) >= paramsCacheSize {
		clear(s.params)
	}
	s.params[l] = la
	s.pmu.Unlock()
	return la, nil
}

// UnknownShard is the shard Take reports when it fails before it knows
// the master of the key's slot: the slot map cannot be loaded, the input
// is bad, or the store is closed.
const UnknownShard = "unknown"

// Take applies req with one script run on the master of req.Key's slot,
// and reports the address of the master that answered (after a MOVED or
// ASK, the one redirected to), or that failed to. It returns within
// Options.Timeout. An error wrapping limiter.ErrUnavailable means the
// shard could not answer, or answered in a way that leaves the count
// unknown (a timeout after the script was sent); any other error is a bad
// request or a script failure.
func (s *Store) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	la, err := s.limitArgs(req.Limit)
	if err != nil {
		return limiter.Decision{}, UnknownShard, fmt.Errorf("redisstore: %w", err)
	}
	o, addr, err := s.send(ctx, req.Key, la, req.Cost, nil)
	if err != nil {
		return limiter.Decision{}, addr, err // o may still be in flight: not reused
	}
	d, err := o.decision(la.p)
	putOp(o)
	return d, addr, err
}

// send checks a call's input, runs la's script for key on the master of
// its slot and returns the answered op, for the caller to read and
// recycle, with the address of the master that answered or failed. lease,
// when set, is a lease call's arguments: they are checked as such and sent
// after the limit's constants.
func (s *Store) send(ctx context.Context, key string, la *limitArgs, cost int64, lease *limiter.LeaseArgs) (*op, string, error) {
	var nowUs int64 // checked as the epoch when Redis TIME will be used
	haveNow := s.opts.Now != nil
	if haveNow {
		nowUs = limiter.Micros(s.opts.Now())
	}
	var err error
	if lease != nil {
		err = limiter.CheckLease(la.p.Limit.Algorithm, nowUs, *lease)
	} else {
		err = limiter.CheckInput(nowUs, cost)
	}
	if err != nil {
		return nil, UnknownShard, fmt.Errorf("redisstore: %w", err)
	}
	if key == "" {
		return nil, UnknownShard, errors.New("redisstore: empty key")
	}
	if s.closed.Load() {
		return nil, UnknownShard, unavailable("store", errors.New("store is closed"))
	}

	deadline := time.Now().Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// The pipelined connection finishes every op by its deadline (see
	// package pipe), so the hot path needs no timer of its own.
	rkey := counterKey(key, la.p.Limit.Algorithm)
	sh, err := s.shardFor(ctx, deadline, rkey)
	if err != nil {
		return nil, UnknownShard, err
	}
	o := getOp()
	o.ctx, o.deadline, o.la, o.key, o.n = ctx, deadline, la, rkey, cost
	if lease != nil {
		o.lease, o.leased = [3]int64{lease.Want, lease.Return, lease.Window}, true
	}
	if haveNow {
		o.now = strconv.FormatInt(nowUs, 10)
	}
	addr, err := sh.do(ctx, o)
	if err != nil {
		return nil, addr, err
	}
	return o, addr, nil
}

// unavailable wraps cause as limiter.ErrUnavailable, naming the shard.
func unavailable(shard string, cause error) error {
	return fmt.Errorf("redisstore: shard %s: %w: %w", shard, limiter.ErrUnavailable, cause)
}
