// Package runner is floodgate-sidecar's composition root: it turns the
// Config into a running sidecar (the store chosen in one place, the engine,
// the proxy, the admin server, the config source) and runs it until its
// context ends, then drains in-flight requests.
package runner

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/configsource"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/proxy/lean"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// Runner is a running sidecar. Create it with New, then call Run.
type Runner struct {
	cfg    Config
	log    *slog.Logger
	labels labels.Set
	source configsource.Source

	reg *prometheus.Registry
	m   *metrics.Metrics
	ev  *events.Queue
	// budget bounds the client connections of both HTTP fronts and the
	// request heads they hold.
	budget *proxy.Budget
	// checked, set before Run, is proxy.Options.Checked: the
	// differential harness's view of every decision.
	checked func(proxy.Checked)
	// started is when the counters started, for the usage report.
	started time.Time

	adminLn, proxyLn net.Listener
	grpcLn           net.Listener     // nil unless --grpc-listen
	rls              *envoyrls.Server // nil unless --grpc-listen
	grpcTLS          *tls.Config      // nil unless --grpc-client-ca-file

	// applyMu serialises applies: the source's updates, key-file
	// reloads and the state read at start.
	applyMu sync.Mutex
	// lastData and lastOrigin are the document in force as delivered, to
	// apply it again when a key file it names changes; keys are the
	// fingerprints of those files when it was applied. Guarded by
	// applyMu.
	lastData   []byte
	lastOrigin string
	keys       map[string]fileStamp
	// forget holds the sets whose removed rules' metrics are still to be
	// deleted, by the cleanup goroutine or before the next compile,
	// whichever comes first; guarded by applyMu. cleanup wakes the
	// goroutine.
	forget  []forgetSets
	cleanup chan struct{}
	// fatal receives the one error that stops the sidecar from its
	// source's deliveries: a first config it refuses for want of a place
	// among the replicas (placeShares).
	fatal chan error

	mu      sync.Mutex // guards status and the fields below
	status  Status
	store   *storeHandle
	engine  *engine.Engine
	proxy   *proxy.Proxy
	current *ruleset.Set
	// local are the in-memory stores, swept by sweepLocal: the fallback
	// buckets, and the counters with the memory store.
	local []*memstore.Store

	px    atomic.Pointer[proxy.Proxy] // set once the first config is in
	ready atomic.Bool

	// clock is what decisions read: nil for the wall clock, or a debugging
	// build's manual clock, moved by clockHandler (clock.go).
	clock        func() time.Time
	clockHandler http.Handler
}

// Status is what /debug/config shows.
type Status struct {
	Revision        string      `json:"revision,omitempty"`
	Origin          string      `json:"origin,omitempty"`
	AppliedAt       *time.Time  `json:"appliedAt,omitempty"`
	LastError       string      `json:"lastError,omitempty"`
	LastErrorAt     *time.Time  `json:"lastErrorAt,omitempty"`
	Store           StoreStatus `json:"store"`
	StoreDrift      string      `json:"storeDrift,omitempty"`
	IgnoredPolicies []string    `json:"ignoredPolicies,omitempty"`
	// ReplacedRules names, as "<policy>.<rule>", the rules this pod does
	// not enforce because a policy it enforces replaces them.
	ReplacedRules []string `json:"replacedRules,omitempty"`
	// FailedPolicies are the policies of the config in force that could
	// not be compiled here, with why; the others are in force.
	FailedPolicies []FailedPolicy `json:"failedPolicies,omitempty"`
	// FromState is set while the config in force was read back from
	// --state-dir at start and its source has not delivered one yet.
	FromState bool `json:"fromState,omitempty"`
	// Rules counts the HTTP rate rules in force on this pod, and
	// ConcurrencyRules its HTTP concurrency rules.
	Rules            int `json:"rules"`
	ConcurrencyRules int `json:"concurrencyRules"`
	// Conditions counts the CEL conditions of the HTTP rules, and how many
	// of them run as Go rather than in cel-go's interpreter.
	Conditions ConditionStatus `json:"conditions"`
	// DescriptorRules counts the rules served on the Envoy rate-limit API.
	DescriptorRules int `json:"descriptorRules"`
	// Format is the format the config in force was written in.
	Format string         `json:"format,omitempty"`
	Config *config.Config `json:"config,omitempty"`
}

// ConditionStatus counts CEL conditions.
type ConditionStatus struct {
	Total  int `json:"total"`
	Native int `json:"native"`
}

// FailedPolicy is a policy that could not be compiled.
type FailedPolicy struct {
	Policy string `json:"policy"`
	Error  string `json:"error"`
	// name is the policy's name within its namespace, as the pod
	// condition names it for the manager.
	name string
}

// StoreStatus describes the store in use; it never holds the password.
type StoreStatus struct {
	Type      string   `json:"type,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
	TLS       bool     `json:"tls,omitempty"`
	From      string   `json:"from,omitempty"`
}

// New prepares a sidecar: it validates cfg and binds both listeners, so
// that a port conflict is reported before Run. source nil means a
// configsource.FileSource on cfg.PolicyFile.
// grpcStreamWorkers is how many long-lived goroutines serve ShouldRateLimit
// calls. A fresh goroutine per call grows its stack again on every call
// (about 13% of the CPU of a Redis-bound decision in profiles); a worker
// keeps its grown stack. Calls beyond the workers still get a goroutine of
// their own, so this bounds nothing. 128 covers the calls in flight of a
// busy sidecar at the cost of about 1 MiB of stacks.
const grpcStreamWorkers = 128

func New(cfg Config, log *slog.Logger, source configsource.Source) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	lbls, err := cfg.Labels()
	if err != nil {
		return nil, err
	}
	if source == nil {
		source = &configsource.FileSource{Path: cfg.PolicyFile, Interval: cfg.PollInterval}
	}
	r := &Runner{cfg: cfg, log: log, labels: lbls, source: source, reg: prometheus.NewRegistry(), cleanup: make(chan struct{}, 1), fatal: make(chan error, 1),
		started: time.Now().UTC().Truncate(time.Millisecond)}
	if r.clock, r.clockHandler, err = debugClock(cfg); err != nil {
		return nil, err
	}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.m = metrics.NewMetrics(r.reg)
	r.budget = proxy.NewBudget(proxy.BudgetOptions{MaxConnections: cfg.MaxConnections,
		MaxPendingHeadBytes: cfg.MaxPendingHeadBytes, Registerer: r.reg})
	r.ev = events.NewQueue(cfg.EventQueue, log.With("component", "deny-events"),
		r.m.DenyEventsTotal.WithLabelValues("logged"), r.m.DenyEventsTotal.WithLabelValues("dropped"))
	r.ev.CountUnlogged(r.m.DenyEventsTotal.WithLabelValues("unlogged"))
	if r.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	if r.proxyLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		_ = r.adminLn.Close()
		return nil, fmt.Errorf("proxy listener: %w", err)
	}
	if cfg.GRPCListen != "" {
		authenticate := cfg.GRPCClientCAFile != ""
		r.rls, err = envoyrls.New(envoyrls.Options{Registerer: r.reg, Events: r.ev, ResponseHeaders: cfg.GRPCResponseHeaders, Log: log,
			Authenticate: authenticate})
		if err == nil && authenticate {
			r.grpcTLS, err = envoyrls.ServerTLS(envoyrls.TLSFiles{
				CertFile: cfg.GRPCTLSCertFile, KeyFile: cfg.GRPCTLSKeyFile, ClientCAFile: cfg.GRPCClientCAFile,
			}, log.With("component", "grpc-tls"))
		}
		if err == nil {
			r.grpcLn, err = net.Listen("tcp", cfg.GRPCListen)
		}
		if err != nil {
			_ = r.adminLn.Close()
			_ = r.proxyLn.Close()
			return nil, fmt.Errorf("grpc listener: %w", err)
		}
	}
	return r, nil
}

// GRPCAddr returns the Envoy rate-limit service listener's address, or ""
// when --grpc-listen is off.
func (r *Runner) GRPCAddr() string {
	if r.grpcLn == nil {
		return ""
	}
	return r.grpcLn.Addr().String()
}

// ProxyAddr returns the proxy listener's address.
func (r *Runner) ProxyAddr() string { return r.proxyLn.Addr().String() }

// AdminAddr returns the admin listener's address.
func (r *Runner) AdminAddr() string { return r.adminLn.Addr().String() }

// Registry returns the sidecar's metrics registry.
func (r *Runner) Registry() *prometheus.Registry { return r.reg }

// Ready reports whether a config is loaded and the proxy serves.
func (r *Runner) Ready() bool { return r.ready.Load() }

// Status returns a copy of the current status.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Run serves until ctx ends, then stops taking requests, drains those in
// flight for up to the drain timeout, and closes the store. It also stops,
// with an error, when the first config the sidecar would enforce has fail-open
// shares it cannot take a place in (see placeShares).
func (r *Runner) Run(ctx context.Context) error {
	admin := &http.Server{Handler: r.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
	adminErr := make(chan error, 1)
	go func() { adminErr <- admin.Serve(r.adminLn) }()

	evCtx, stopEvents := context.WithCancel(context.WithoutCancel(ctx))
	go r.ev.Run(evCtx)

	// The last good config saved before a restart is in force until the
	// source delivers one: the API server may be unreachable.
	r.applySaved()
	srcCtx, stopSource := context.WithCancel(ctx)
	srcDone := make(chan struct{})
	go func() {
		defer close(srcDone)
		r.source.Run(srcCtx, r.apply)
	}()
	keysDone := make(chan struct{})
	go func() {
		defer close(keysDone)
		r.watchKeyFiles(srcCtx)
	}()
	cleanDone := make(chan struct{})
	go func() {
		defer close(cleanDone)
		r.cleanMetrics(srcCtx)
	}()
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		r.sweepLocal(srcCtx, sweepInterval)
	}()

	// The proxy listener serves from the start: 503 until the first good
	// config has opened the store and built the proxy.
	// Both fronts take their connections from one listener, which counts
	// each once against the cap on connections; the lean core charges
	// the heads it reads itself, the net/http server's are counted on
	// its connections (HeadListener).
	srv := r.proxyServer()
	proxyErr := make(chan error, 1)
	ln := lingerListener{Listener: r.proxyLn, budget: r.budget}
	ls := r.leanServer()
	if ls != nil {
		go func() { proxyErr <- ls.Serve(ln) }()
		go func() { _ = srv.Serve(r.budget.HeadListener(ls.Handoff())) }()
	} else {
		go func() { proxyErr <- srv.Serve(r.budget.HeadListener(ln)) }()
	}
	// The Envoy rate-limit service serves from the start too: UNAVAILABLE
	// and health NOT_SERVING until the first good config.
	var gs *grpc.Server
	grpcErr := make(chan error, 1)
	if r.grpcLn != nil {
		opts := []grpc.ServerOption{grpc.NumStreamWorkers(grpcStreamWorkers)}
		if r.grpcTLS != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(r.grpcTLS)))
		}
		gs = grpc.NewServer(opts...)
		r.rls.Register(gs)
		go func() { grpcErr <- gs.Serve(r.grpcLn) }()
	}
	r.log.Info("serving", "listen", r.ProxyAddr(), "admin", r.AdminAddr(), "grpc", r.GRPCAddr(), "upstream", r.cfg.Upstream)

	var err error
	select {
	case <-ctx.Done():
	case err = <-r.fatal:
	case err = <-proxyErr:
		err = fmt.Errorf("proxy server: %w", err)
	case err = <-adminErr:
		err = fmt.Errorf("admin server: %w", err)
	case err = <-grpcErr:
		err = fmt.Errorf("grpc server: %w", err)
	}
	r.ready.Store(false)
	stopSource()
	<-srcDone
	<-keysDone
	<-cleanDone
	<-sweepDone
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DrainTimeout)
	defer cancel()
	grpcDone := make(chan struct{})
	if gs != nil {
		// Health turns NOT_SERVING first, then in-flight calls drain.
		r.rls.Shutdown()
		go func() { gs.GracefulStop(); close(grpcDone) }()
	} else {
		close(grpcDone)
	}
	leanDone := make(chan error, 1)
	if ls != nil {
		go func() { leanDone <- ls.Shutdown(drainCtx) }()
	} else {
		leanDone <- nil
	}
	if e := srv.Shutdown(drainCtx); e != nil {
		err = errors.Join(err, fmt.Errorf("draining requests: %w", e))
	}
	if e := <-leanDone; e != nil {
		err = errors.Join(err, fmt.Errorf("draining requests: %w", e))
	}
	if gs != nil {
		select {
		case <-grpcDone:
		case <-drainCtx.Done():
			gs.Stop()
			<-grpcDone
			err = errors.Join(err, errors.New("draining grpc calls: drain timeout"))
		}
	}
	_ = admin.Shutdown(drainCtx)
	r.mu.Lock()
	st, eng := r.store, r.engine
	r.mu.Unlock()
	if eng != nil {
		// Give back the unused tokens of every lease before the store
		// closes, so that the other sidecars can spend them.
		leaseCtx, cancelLeases := context.WithTimeout(context.WithoutCancel(ctx), leaseReturnTimeout)
		if e := eng.Close(leaseCtx); e != nil {
			err = errors.Join(err, fmt.Errorf("closing the engine: %w", e))
		}
		cancelLeases()
	}
	if st != nil && st.close != nil {
		if e := st.close(); e != nil {
			err = errors.Join(err, fmt.Errorf("closing store: %w", e))
		}
	}
	stopEvents()
	<-r.ev.Done()
	r.log.Info("stopped")
	return err
}

// leaseReturnTimeout bounds the return of the leases at shutdown.
const leaseReturnTimeout = 2 * time.Second

// leaseOptions are the engine's lease options: leases with the defaults
// on a remote store, where they save a round trip per request, and none
// on the memory store, which decides locally anyway.
func leaseOptions(remote bool) *engine.LeaseOptions {
	if !remote {
		return nil
	}
	return &engine.LeaseOptions{}
}

func (r *Runner) proxyServer() *http.Server {
	var ps http.Protocols
	ps.SetHTTP1(true)
	ps.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           r.budget.Handler(http.HandlerFunc(r.serveProxy)),
		ConnState:         r.budget.ConnState,
		ConnContext:       r.budget.ConnContext,
		Protocols:         &ps,
		ReadHeaderTimeout: r.cfg.ReadHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		// net/http lets up to 4096 bytes more through; the proxy answers
		// 431 exactly at the bound (proxy.HeaderSize), and net/http's own
		// 431 for larger blocks reaches the client because the listener
		// lingers on close.
		MaxHeaderBytes: r.cfg.MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(r.log.Handler(), slog.LevelDebug),
	}
}

// leanServer returns the lean HTTP/1.1 core in front of the net/http
// server, or nil when it is off or the upstream needs what only net/http
// offers (https, h2c, a path prefix).
func (r *Runner) leanServer() *lean.Server {
	up, err := url.Parse(r.cfg.Upstream)
	if !r.cfg.LeanHTTP1 || err != nil || r.cfg.UpstreamH2C || up.Scheme != "http" || (up.Path != "" && up.Path != "/") || up.RawQuery != "" {
		return nil
	}
	host := up.Host
	if up.Port() == "" {
		host = net.JoinHostPort(up.Hostname(), "80")
	}
	return lean.New(lean.Options{
		Upstream:               host,
		Proxy:                  r.px.Load,
		MaxHeaderBytes:         r.cfg.MaxHeaderBytes,
		ReadHeaderTimeout:      r.cfg.ReadHeaderTimeout,
		BodyTimeout:            r.cfg.BodyTimeout,
		BodyMinRate:            r.cfg.BodyMinRate,
		Budget:                 r.budget,
		IdleTimeout:            2 * time.Minute,
		AllowUnderscoreHeaders: r.cfg.AllowUnderscoreHeaders,
		Log:                    r.log,
	})
}

// serveProxy hands a request to the proxy, or answers 503 while no config
// has been loaded.
func (r *Runner) serveProxy(w http.ResponseWriter, req *http.Request) {
	if p := r.px.Load(); p != nil {
		p.ServeHTTP(w, req)
		return
	}
	proxy.NotReady(w, req)
}

// apply is the one place a config update takes effect: parse, validate and
// compile it, and install it, or keep the last good config and report why.
// The first good config also opens the store and starts the proxy.
func (r *Runner) apply(u configsource.Update) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	applied := r.applyUpdate(u, false)
	if applied {
		r.lastData, r.lastOrigin = u.Data, u.Origin
		r.save(u.Data)
	}
	if u.Result != nil {
		st := r.Status()
		o := configsource.Outcome{InForce: st.Revision}
		if st.LastError != "" {
			o.Err = errors.New(st.LastError)
		}
		for _, f := range st.FailedPolicies {
			o.Failed = append(o.Failed, f.name)
		}
		u.Result(o)
	}
}

// applyUpdate applies u and reports whether it is now in force.
func (r *Runner) applyUpdate(u configsource.Update, fromState bool) bool {
	// The metrics of rules removed by the last update go before a new set
	// can make series of the same names again.
	r.forgetPending()
	if u.Err != nil {
		r.reject(u.Origin, u.Err)
		return false
	}
	// A policy file may be floodgate's sidecar config or an
	// envoyproxy/ratelimit config, told apart by shape.
	c, format, _, err := rlsimport.LoadAny(u.Data, rlsimport.Options{})
	if err != nil {
		r.reject(u.Origin, err)
		return false
	}
	r.mu.Lock()
	if r.engine == nil {
		if err := r.openLocked(c); err != nil {
			r.mu.Unlock()
			r.reject(u.Origin, err)
			return false
		}
	}
	r.mu.Unlock()
	keys := stampKeyFiles(c)
	set, err := ruleset.CompileFor(c, ruleset.Pod{Labels: r.labels, Name: r.cfg.PodName}, r.m)
	if err != nil {
		r.reject(u.Origin, fmt.Errorf("compile sidecar config: %w", err))
		return false
	}
	r.mu.Lock()
	remote, current := r.store.remote, r.current
	r.mu.Unlock()
	if err := r.cfg.placeShares(set, remote); err != nil {
		if current == nil {
			// Nothing in force yet: this sidecar was started without the
			// identity its config needs, which a restart with --pod-name
			// fixes. Stopping shows the mistake where it is made, instead
			// of a pod answering 503 until someone reads its status.
			select {
			case r.fatal <- fmt.Errorf("%s: %w", u.Origin, err):
			default:
			}
			return false
		}
		// Compiling set made series for its rules; those current lacks go.
		r.forgetLater(set, current)
		r.reject(u.Origin, err)
		return false
	}
	r.keys = keys
	r.install(u.Origin, c, set, format, fromState)
	return true
}

// openLocked opens the store for the first config and builds the engine
// and proxy. The caller holds r.mu.
func (r *Runner) openLocked(c *config.Config) error {
	sel := r.cfg.selectStore(c)
	if r.clock != nil && sel.Type != config.StoreMemory {
		return fmt.Errorf("the manual clock needs the memory store: a %s store decides on its own clock", sel.Type)
	}
	st, err := openStore(sel, r.cfg, r.clock, r.reg, r.log)
	if err != nil {
		return fmt.Errorf("open %s store: %w", sel.Type, err)
	}
	fallback, err := memstore.New(memOptions(r.cfg, r.clock)...)
	if err != nil {
		_ = closeStore(st)
		return fmt.Errorf("fallback store: %w", err)
	}
	eng, err := engine.New(engine.Options{
		Store: st.store, StoreName: sel.Type, Fallback: fallback,
		Metrics: r.m, DenyCacheKeys: r.cfg.DenyCacheKeys, Parallel: st.remote, Now: r.clock,
		Budget: st.budget, Leases: leaseOptions(st.remote), Log: r.log,
	})
	if err != nil {
		_ = closeStore(st)
		return err
	}
	up, _ := url.Parse(r.cfg.Upstream) // validated
	px, err := proxy.New(proxy.Options{Upstream: up, UpstreamH2C: r.cfg.UpstreamH2C, Engine: eng, Metrics: r.m, Events: r.ev, Log: r.log,
		MaxHeaderBytes: r.cfg.MaxHeaderBytes, MaxDelayed: r.cfg.MaxDelayed, BodyTimeout: r.cfg.BodyTimeout, BodyMinRate: r.cfg.BodyMinRate,
		AllowUnderscoreHeaders: r.cfg.AllowUnderscoreHeaders, Checked: r.checked})
	if err != nil {
		_ = closeStore(st)
		return err
	}
	r.store, r.engine, r.proxy = st, eng, px
	r.local = []*memstore.Store{fallback}
	if ms, ok := st.store.(*memstore.Store); ok {
		r.local = append(r.local, ms)
	}
	r.status.Store = StoreStatus{Type: sel.Type, Addresses: sel.Addresses, TLS: sel.TLS != nil, From: sel.From}
	r.log.Info("counter store opened", "type", sel.Type, "addresses", sel.Addresses, "from", sel.From)
	return nil
}

func closeStore(st *storeHandle) error {
	if st.close == nil {
		return nil
	}
	return st.close()
}

// install puts a compiled set in force. The metrics of the rules it
// removes are deleted afterwards, off the apply and off r.mu (see
// cleanMetrics), so that neither the update, /debug/config nor the pod
// condition waits for them.
func (r *Runner) install(origin string, c *config.Config, set *ruleset.Set, format rlsimport.Format, fromState bool) {
	r.mu.Lock()
	old := r.current
	r.current = set
	r.proxy.SetRules(set)
	if r.rls != nil {
		r.rls.Install(r.engine, set)
	}
	if old != nil {
		// A limit may have been raised: local denials may be stale. The
		// shared counters are untouched.
		r.engine.ForgetLocalState()
	}
	now := time.Now()
	r.status.Revision, r.status.Origin, r.status.AppliedAt = c.Revision, origin, &now
	r.status.LastError, r.status.LastErrorAt = "", nil
	r.status.IgnoredPolicies, r.status.Rules, r.status.Config = set.Ignored, len(set.Rules), c
	r.status.ConcurrencyRules = len(set.Concurrency)
	r.status.ReplacedRules = set.Replaced
	r.status.Conditions.Native, r.status.Conditions.Total = set.Conditions()
	r.status.FromState = fromState
	r.status.FailedPolicies = nil
	for _, f := range set.Failed {
		r.status.FailedPolicies = append(r.status.FailedPolicies, FailedPolicy{Policy: f.ID(), Error: f.Err.Error(), name: f.Name})
	}
	r.status.DescriptorRules, r.status.Format = len(set.Descriptors.Rules()), format.String()
	r.status.StoreDrift = ""
	if want := r.cfg.selectStore(c); r.status.Store.From == "policy-file" && !sameStore(want, r.status.Store) {
		r.followStoreLocked(want)
	}
	first := !r.ready.Load()
	r.mu.Unlock()

	if old != nil {
		r.forgetLater(old, set)
	}
	r.m.PolicyFailed.Reset()
	for _, f := range set.Failed {
		r.m.PolicyFailed.WithLabelValues(f.ID()).Set(1)
		r.log.Error("policy not enforced: it does not compile here; the other policies are in force", "policy", f.ID(), "err", f.Err)
	}
	if fromState {
		r.m.ConfigFromState.Set(1)
	} else {
		r.m.ConfigFromState.Set(0)
	}
	r.m.ConfigInfo.Reset()
	r.m.ConfigInfo.WithLabelValues(c.Revision).Set(1)
	r.m.ConfigLoadsTotal.WithLabelValues("ok").Inc()
	r.m.ConfigValid.Set(1)
	r.m.ConfigLastSuccess.Set(float64(now.Unix()))
	r.log.Info("config applied", "revision", c.Revision, "origin", origin, "rules", len(set.Rules), "concurrencyRules", len(set.Concurrency), "ignoredPolicies", set.Ignored, "failedPolicies", len(set.Failed))
	if first {
		r.px.Store(r.proxy)
		r.ready.Store(true)
	}
}

func sameStore(sel storeSelection, s StoreStatus) bool {
	return sel.Type == s.Type && reflect.DeepEqual(sel.Addresses, s.Addresses)
}

// followStoreLocked handles a config whose store section differs from the
// store in use. New addresses of the same Redis store (every node of a
// managed store replaced, or its masters changed) are followed at once:
// the store loads the slot map from them and switches to it. Another
// store type or TLS setting takes effect at restart. r.mu is held.
func (r *Runner) followStoreLocked(want storeSelection) {
	cur := r.status.Store
	if want.Type == cur.Type && want.Type == config.StoreRedis && (want.TLS != nil) == cur.TLS && r.store.setAddrs != nil {
		if err := r.store.setAddrs(want.Addresses); err != nil {
			r.status.StoreDrift = fmt.Sprintf("the policy file names the store at %v, which cannot be used: %v", want.Addresses, err)
			r.log.Warn("the store's new addresses cannot be used; keeping the old ones", "addresses", want.Addresses, "err", err)
			return
		}
		r.log.Info("following the store to new addresses", "from", cur.Addresses, "to", want.Addresses)
		r.status.Store.Addresses = want.Addresses
		return
	}
	r.status.StoreDrift = fmt.Sprintf("the policy file now names a %s store at %v; restart the sidecar to switch", want.Type, want.Addresses)
	r.log.Warn("store section changed; it takes effect at restart", "type", want.Type, "addresses", want.Addresses)
}

// forgetSets is a change of rule set whose removed rules' metrics are to
// be deleted.
type forgetSets struct{ old, cur *ruleset.Set }

// forgetLater has the metrics of the rules of old that cur lacks deleted
// soon, by cleanMetrics, or before the next compile. The caller holds
// applyMu.
func (r *Runner) forgetLater(old, cur *ruleset.Set) {
	r.forget = append(r.forget, forgetSets{old: old, cur: cur})
	select {
	case r.cleanup <- struct{}{}:
	default:
	}
}

// forgetPending deletes the metrics of the rules the pending changes
// removed. The caller holds applyMu, which keeps any later set from
// making series of those names before they are deleted.
func (r *Runner) forgetPending() {
	for _, f := range r.forget {
		r.forgetRemovedRules(f.old, f.cur)
	}
	r.forget = nil
}

// cleanMetrics deletes removed rules' metrics soon after each update,
// until ctx ends.
func (r *Runner) cleanMetrics(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cleanup:
		}
		r.applyMu.Lock()
		r.forgetPending()
		r.applyMu.Unlock()
	}
}

// forgetRemovedRules deletes the metrics of the rules of old that cur no
// longer has: O(rules), each series deleted by its labels.
func (r *Runner) forgetRemovedRules(old, cur *ruleset.Set) {
	keep := make(map[[2]string]bool, len(cur.Rules))
	for _, ru := range cur.Rules {
		keep[[2]string{ru.Engine.Policy, ru.Engine.Name}] = true
	}
	for _, ru := range cur.Descriptors.Rules() {
		keep[[2]string{ru.Policy, ru.Name}] = true
	}
	for _, ru := range old.Rules {
		if !keep[[2]string{ru.Engine.Policy, ru.Engine.Name}] {
			r.m.ForgetRule(ru.Engine.Policy, ru.Engine.Name)
		}
	}
	for _, ru := range old.Descriptors.Rules() {
		if !keep[[2]string{ru.Policy, ru.Name}] {
			r.m.ForgetRule(ru.Policy, ru.Name)
		}
	}
}

// reject records a config that could not be applied; the last good config
// stays in force.
func (r *Runner) reject(origin string, err error) {
	now := time.Now()
	r.mu.Lock()
	r.status.LastError, r.status.LastErrorAt = err.Error(), &now
	if r.status.Origin == "" {
		r.status.Origin = origin
	}
	haveConfig := r.current != nil
	r.mu.Unlock()
	r.m.ConfigLoadsTotal.WithLabelValues("error").Inc()
	r.m.ConfigErrorsTotal.Inc()
	r.m.ConfigValid.Set(0)
	r.log.Error("config rejected; keeping the last good config", "origin", origin, "err", err, "haveConfig", haveConfig)
}

func (r *Runner) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !r.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("no config loaded\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+config.UsagePath, func(w http.ResponseWriter, _ *http.Request) {
		u := config.Usage{Started: r.started, Rules: []config.RuleUsage{}}
		r.mu.Lock()
		u.Revision = r.status.Revision
		r.mu.Unlock()
		for _, t := range r.m.Totals() {
			u.Rules = append(u.Rules, config.RuleUsage{Policy: t.Policy, Rule: t.Rule, Allowed: t.Allowed, Denied: t.Denied,
				ShadowDenied: t.ShadowDenied, Unavailable: t.Unavailable, Exempt: t.Exempt})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(u)
	})
	mux.HandleFunc("GET /debug/config", func(w http.ResponseWriter, req *http.Request) {
		var body any = r.Status()
		if !fromLoopback(req) {
			red, err := redactStatus(r.Status())
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			body = red
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		_ = enc.Encode(body)
	})
	if r.clockHandler != nil {
		mux.Handle("/debug/clock", loopbackOnly(r.clockHandler))
	}
	if r.cfg.AdminPprof {
		mux.Handle("GET /debug/pprof/", loopbackOnly(http.HandlerFunc(pprof.Index)))
		mux.Handle("GET /debug/pprof/cmdline", loopbackOnly(http.HandlerFunc(pprof.Cmdline)))
		mux.Handle("GET /debug/pprof/profile", loopbackOnly(http.HandlerFunc(pprof.Profile)))
		mux.Handle("GET /debug/pprof/symbol", loopbackOnly(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("GET /debug/pprof/trace", loopbackOnly(http.HandlerFunc(pprof.Trace)))
	}
	return mux
}
