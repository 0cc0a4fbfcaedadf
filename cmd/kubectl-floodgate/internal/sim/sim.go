// Package sim replays requests against a sidecar config on a simulated
// clock, through the sidecar's own HTTP front: the proxy handler
// (sidecar/proxy) with its matcher, key extraction and cost, the decision
// engine and its deny cache (sidecar/engine), and the in-memory store
// (sidecar/store/memstore), all reading the simulated clock instead of the
// wall clock. Every answer is the one a client would get from a sidecar
// with the memory store, status, rate-limit fields and problem detail
// included; a request the sidecar lets through reaches a stand-in
// application that answers 200.
package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/trace"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// Fields are the response fields a decision reports, in this order.
var Fields = []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit", "Retry-After"}

// Outcomes of a request.
const (
	// Allowed: the request reached the application.
	Allowed = "allowed"
	// Denied: 429.
	Denied = "denied"
	// Rejected: 400, a key part or cost the rule rejects.
	Rejected = "rejected"
	// Unavailable: 503, a fail-closed rule without its store.
	Unavailable = "unavailable"
)

// Decision is the answer to one request.
type Decision struct {
	At     time.Time `json:"at"`
	Method string    `json:"method"`
	Target string    `json:"target"`
	Client string    `json:"client"`
	// Request holds the request's headers as replayed.
	Request map[string]string `json:"request,omitempty"`
	Status  int               `json:"status"`
	Outcome string            `json:"outcome"`
	// Headers are the rate-limit response fields (Fields) present.
	Headers map[string]string `json:"headers,omitempty"`
	// Detail is the problem detail of an answer the sidecar gave itself.
	Detail string `json:"detail,omitempty"`
	// Delay is how long a rule with onExceed: Delay held the request
	// before it went on to the application, as a Go duration; empty when
	// it went at once.
	Delay string `json:"delay,omitempty"`
}

// Options configure a Simulator.
type Options struct {
	// Config is the sidecar config; it must have passed Validate.
	Config *config.Config
	// PodLabels, when set, are the labels of the pod simulated: only the
	// policies whose podSelector selects them apply. Nil applies every
	// policy.
	PodLabels labels.Set
	// Start is the clock's time before the first request.
	Start time.Time
}

// Simulator replays requests. It is not safe for concurrent use: requests
// are decided one at a time, in order, each at its own instant.
type Simulator struct {
	clock *clock
	px    *proxy.Proxy
	set   *ruleset.Set
	// delay is the wait of the request being decided: the engine's timer
	// fires at once on the simulated clock, which does not move during a
	// request, and records it.
	delay time.Duration
}

// New builds a simulator.
func New(o Options) (*Simulator, error) {
	c := o.Config
	if o.PodLabels == nil {
		cp := *c
		cp.Policies = append([]config.Policy(nil), c.Policies...)
		for i := range cp.Policies {
			cp.Policies[i].PodSelector = nil
		}
		c = &cp
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, o.PodLabels, m)
	if err != nil {
		return nil, fmt.Errorf("compile sidecar config: %w", err)
	}
	clk := &clock{t: o.Start}
	store, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		return nil, err
	}
	fallback, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		return nil, err
	}
	s := &Simulator{clock: clk}
	eng, err := engine.New(engine.Options{Store: store, StoreName: config.StoreMemory, Fallback: fallback, Metrics: m, Now: clk.Now,
		After: func(d time.Duration) <-chan time.Time {
			s.delay = d
			fired := make(chan time.Time, 1)
			fired <- clk.Now().Add(d)
			return fired
		}})
	if err != nil {
		return nil, err
	}
	app := &url.URL{Scheme: "http", Host: "application.invalid"}
	px, err := proxy.New(proxy.Options{Upstream: app, Transport: application{}, Engine: eng, Metrics: m})
	if err != nil {
		return nil, err
	}
	px.SetRules(set)
	s.px, s.set = px, set
	return s, nil
}

// Rules is the number of rate rules in force; Ignored names the policies
// whose podSelector does not select the simulated pod; DescriptorRules
// counts the rules that apply only to Envoy's rate-limit calls, which are
// not simulated.
func (s *Simulator) Rules() (rules int, ignored []string, descriptorRules int) {
	return len(s.set.Rules), s.set.Ignored, len(s.set.Descriptors.Rules())
}

// ConcurrencyRules is the number of concurrency rules in force, which
// Rules does not count.
func (s *Simulator) ConcurrencyRules() int { return len(s.set.Concurrency) }

// Do decides one request at its instant. Requests must come in time order;
// the clock never goes back.
func (s *Simulator) Do(r trace.Request) (Decision, error) {
	if r.At.Before(s.clock.Now()) {
		return Decision{}, fmt.Errorf("request at %v comes before the previous one", r.At)
	}
	s.clock.set(r.At)
	s.delay = 0
	req := httptest.NewRequest(r.Method, "http://application.invalid"+r.Target, nil)
	req.Header = r.Header.Clone()
	if r.Host != "" {
		req.Host = r.Host
	}
	req.RemoteAddr = net.JoinHostPort(r.Client, "40000")
	w := httptest.NewRecorder()
	s.px.ServeHTTP(w, req)
	resp := w.Result()
	d := Decision{At: r.At, Method: r.Method, Target: r.Target, Client: r.Client, Status: resp.StatusCode}
	if len(r.Header) > 0 {
		d.Request = map[string]string{}
		for n, vs := range r.Header {
			d.Request[n] = joinValues(vs)
		}
	}
	for _, f := range Fields {
		if vs := resp.Header.Values(f); len(vs) > 0 {
			if d.Headers == nil {
				d.Headers = map[string]string{}
			}
			d.Headers[http.CanonicalHeaderKey(f)] = joinValues(vs)
		}
	}
	switch {
	case resp.Header.Get(appHeader) != "":
		d.Outcome = Allowed
		if s.delay > 0 {
			d.Delay = s.delay.String()
		}
	case resp.StatusCode == http.StatusTooManyRequests:
		d.Outcome = Denied
	case resp.StatusCode == http.StatusBadRequest:
		d.Outcome = Rejected
	default:
		d.Outcome = Unavailable
	}
	if d.Outcome != Allowed {
		var pb struct {
			Detail string `json:"detail"`
		}
		if json.Unmarshal(w.Body.Bytes(), &pb) == nil {
			d.Detail = pb.Detail
		}
	}
	return d, nil
}

func joinValues(vs []string) string {
	if len(vs) == 1 {
		return vs[0]
	}
	var b bytes.Buffer
	for i, v := range vs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v)
	}
	return b.String()
}

// clock is the simulated clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// appHeader marks an answer of the stand-in application.
const appHeader = "X-Floodgate-Simulated-Application"

// application stands in for the application behind the sidecar.
type application struct{}

func (application) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{appHeader: {"1"}}, Body: http.NoBody, Request: r,
	}, nil
}
