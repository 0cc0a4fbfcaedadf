package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
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
	keys redislayout.Keys
	// cc keeps the slot map only; nil in single mode. SetAddrs replaces
	// it with one seeded from new addresses.
	cc atomic.Pointer[redis.ClusterClient]
	// route guards topology lookups: when no node can tell the slot map,
	// it fails decisions fast like a shard breaker.
	route *breaker

	mu     sync.Mutex
	shards atomic.Pointer[map[string]*shard] // copy on write under mu

	pmu    sync.Mutex
	params map[limiter.Limit]*limitArgs

	// seedMu guards seeds (the addresses cc was built from, sorted) and
	// reseed (the replacement being loaded, if any).
	seedMu sync.Mutex
	seeds  []string
	reseed *reseed

	// The first slot-map load is shared by the callers that arrive before
	// it ends, instead of each loading it (go-redis would).
	loadMu   sync.Mutex
	loaded   atomic.Bool
	inflight *slotLoad

	closed atomic.Bool
	// nextOpenReload is when (Unix ns) a call failed fast by an open
	// breaker may next ask for a slot-map reload.
	nextOpenReload atomic.Int64
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
		keys:   redislayout.Keys{Space: o.KeySpace},
		route:  newBreaker(o.BreakerFailures, o.BreakerCooldown, time.Now, nil),
		params: map[limiter.Limit]*limitArgs{},
	}
	empty := map[string]*shard{}
	s.shards.Store(&empty)
	if !o.Single {
		s.seeds = sortedCopy(o.Addrs)
		s.cc.Store(newClusterClient(o, o.Addrs))
		// Start loading the slot map now; the first decisions wait for
		// this load instead of starting their own.
		go func() { _ = s.loadSlots(context.Background()) }()
	}
	return s, nil
}

// newClusterClient returns the go-redis client that keeps the slot map,
// seeded with addrs.
func newClusterClient(o Options, addrs []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:               addrs,
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
		// A connection that is not authenticated when the node wants
		// it to be is refused here (checkAuth) rather than pooled. The
		// name is a courtesy to whoever reads CLIENT LIST: a node that
		// refuses it (ACLs) still serves the slot map, where go-redis's
		// own ClientName would fail the connection.
		OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			if err := checkAuth(ctx, cn); err != nil {
				return err
			}
			_ = cn.ClientSetName(ctx, o.ClientName).Err()
			return nil
		},
		ClusterStateReloadInterval: 5 * time.Second,
		MaintNotificationsConfig:   &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		Dialer:                     slotMapDialer(o),
	})
}

// maxSlotMapDialPause bounds the random pause after a repeated failed
// dial of the slot-map client.
const maxSlotMapDialPause = time.Second

// slotMapDialer dials a node for the slot-map client as go-redis would,
// but reports the third and later failed dials in a row to a node only
// after a random pause of up to maxSlotMapDialPause (or the dial's context
// end). After two failures go-redis stops dialling the node for its
// callers and retries it every second in the background; every sidecar
// loses the node in the same instant, so without the pause their retries,
// and the connections that follow them, would reach the node back in the
// same millisecond. The first two failures are not delayed: a slot-map
// load that meets a dead node moves on to the next one at once.
func slotMapDialer(o Options) func(context.Context, string, string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 5 * time.Minute}
	var mu sync.Mutex
	failures := map[string]int{}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		tc, err := o.dialTLS()
		switch {
		case err != nil:
		case tc != nil:
			c, err = (&tls.Dialer{NetDialer: nd, Config: tc}).DialContext(ctx, network, addr)
		default:
			c, err = nd.DialContext(ctx, network, addr)
		}
		mu.Lock()
		n := 0
		if err != nil {
			failures[addr]++
			n = failures[addr]
		} else {
			delete(failures, addr)
		}
		mu.Unlock()
		if n > 2 {
			t := time.NewTimer(rand.N(maxSlotMapDialPause))
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		return c, err
	}
}

func sortedCopy(a []string) []string {
	out := append([]string(nil), a...)
	sort.Strings(out)
	return out
}

// reseed is one replacement of the slot map's client being loaded.
type reseed struct {
	cancel context.CancelFunc
}

// reseedRetry is the pause, jittered, between attempts to load the slot
// map from new seed addresses that do not answer yet.
const reseedRetry = time.Second

// Seeds returns the seed addresses the slot map is loaded from, sorted.
func (s *Store) Seeds() []string {
	s.seedMu.Lock()
	defer s.seedMu.Unlock()
	if s.opts.Single {
		return append([]string(nil), s.opts.Addrs...)
	}
	return append([]string(nil), s.seeds...)
}

// SetAddrs gives the store new seed addresses, as when every node of the
// cluster was replaced and the old addresses answer no more: the slot map
// is loaded from the new seeds in the background, retried until one of
// them answers, and then replaces the old one, so that decisions route to
// the new masters without a restart. Until then the old map stays in
// use. Counts live in Redis, so nothing is lost by the switch. An
// unchanged set of addresses (in any order) changes nothing. It is an
// error in single mode, and for an address that is not host:port.
func (s *Store) SetAddrs(addrs []string) error {
	if s.opts.Single {
		return errors.New("redisstore: a single-server store cannot change its address")
	}
	o := s.opts
	o.Addrs = addrs
	if err := o.Validate(); err != nil {
		return err
	}
	next := sortedCopy(addrs)
	s.seedMu.Lock()
	defer s.seedMu.Unlock()
	if slices.Equal(next, s.seeds) || s.closed.Load() {
		return nil
	}
	if s.reseed != nil {
		s.reseed.cancel() // superseded
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &reseed{cancel: cancel}
	s.reseed, s.seeds = r, next
	go s.runReseed(ctx, r, newClusterClient(s.opts, next))
	return nil
}

// runReseed loads the slot map with cc until it succeeds, then makes cc
// the store's slot map client; it gives up, closing cc, when ctx ends (a
// newer SetAddrs, or Close).
func (s *Store) runReseed(ctx context.Context, r *reseed, cc *redis.ClusterClient) {
	for {
		lctx, cancel := context.WithTimeout(ctx, slotLoadTimeout)
		_, err := cc.MasterForKey(lctx, "fg:{}")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			_ = cc.Close()
			return
		case <-time.After(jitterCooldown(reseedRetry)):
		}
	}
	s.seedMu.Lock()
	if s.reseed != r || s.closed.Load() {
		s.seedMu.Unlock()
		_ = cc.Close()
		return
	}
	s.reseed = nil
	old := s.cc.Swap(cc)
	s.seedMu.Unlock()
	s.loadMu.Lock()
	s.loaded.Store(true)
	s.loadMu.Unlock()
	_ = old.Close()
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
	s.seedMu.Lock()
	if s.reseed != nil {
		s.reseed.cancel()
		s.reseed = nil
	}
	s.seedMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range *s.shards.Load() {
		sh.close()
	}
	if cc := s.cc.Load(); cc != nil {
		if err := cc.Close(); err != nil {
			return fmt.Errorf("redisstore: close the slot map's client: %w", err)
		}
	}
	return nil
}

// Timeout returns the per-call deadline (Options.Timeout, or its default).
func (s *Store) Timeout() time.Duration { return s.opts.Timeout }

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
	// Decisions is how many decisions they carried (resends after
	// "Function not found" or a redirect included). Decisions / Writes is the mean batch.
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
	c, err := s.cc.Load().MasterForKey(ctx, key)
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
			_, err := s.cc.Load().MasterForKey(lctx, "fg:{}")
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

// openReloadInterval is the mean spacing of the slot-map reloads that the
// calls a breaker fails fast ask for (each spacing drawn between half and
// one and a half of it): often enough that the sidecars find a promoted
// replica a few hundred milliseconds after a failover, rarely enough that
// a fleet waiting out an outage asks little of the cluster when it is back.
const openReloadInterval = 250 * time.Millisecond

// reloadWhileOpen reloads the slot map for a call that an open breaker
// failed fast, at most once per jittered openReloadInterval.
func (s *Store) reloadWhileOpen() {
	now := time.Now().UnixNano()
	next := s.nextOpenReload.Load()
	if now < next || !s.nextOpenReload.CompareAndSwap(next, now+int64(jitterCooldown(openReloadInterval))) {
		return
	}
	s.reloadTopology()
}

// reloadTopology asks the cluster client to reload the slot map in the
// background. Concurrent requests coalesce into one reload at a time, at
// most one per 200ms.
func (s *Store) reloadTopology() {
	if cc := s.cc.Load(); cc != nil && !s.closed.Load() {
		cc.ReloadState(context.Background())
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
	o, addr, err := s.send(ctx, req.Key, la, req.Cost, nil, req.Deadline)
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
// after the limit's constants. The call ends by the earliest of its budget
// (Options.Timeout), ctx's deadline and caller's (unless zero).
func (s *Store) send(ctx context.Context, key string, la *limitArgs, cost int64, lease *limiter.LeaseArgs, caller time.Time) (*op, string, error) {
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

	sent := time.Now()
	deadline := sent.Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if !caller.IsZero() && caller.Before(deadline) {
		deadline = caller
	}
	// A call that had (about) the whole budget and got no answer in it
	// trips the breaker (see breaker); one the caller gave much less, after
	// waiting elsewhere, proves nothing about the node.
	full := deadline.Sub(sent) >= s.opts.Timeout*3/4
	rkey := s.keys.Counter(key, la.p.Limit.Algorithm)
	sh, err := s.shardFor(ctx, deadline, rkey)
	if err != nil {
		return nil, UnknownShard, err
	}
	o := getOp()
	o.ctx, o.deadline, o.full, o.la, o.key, o.n = ctx, deadline, full, la, rkey, cost
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
