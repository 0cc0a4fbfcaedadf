// Package proxy is floodgate-sidecar's HTTP front: it matches each request
// to the rules in force, asks the decision engine, and either proxies the
// request to the application or answers 429 (or 503 for a fail-closed rule
// whose store is unreachable) itself. A denied request never reaches the
// application.
//
// Proxying is httputil.ReverseProxy: HTTP/1.1 and h2c in front, streaming
// bodies both ways, WebSocket and other upgrades passed through, hop-by-hop
// headers removed, and copy buffers taken from a pool rather than allocated
// per request.
//
// # Response fields
//
// Every response to a request that an enforced rule matched carries the
// fields of the binding rule (see package engine): X-RateLimit-Limit (the
// key's capacity), X-RateLimit-Remaining and X-RateLimit-Reset (seconds
// until the key is back to full, rounded up), plus the RateLimit-Policy and
// RateLimit fields of draft-ietf-httpapi-ratelimit-headers-09 in their
// structured-field form:
//
//	RateLimit-Policy: "checkout.per-user";q=100;w=60
//	RateLimit: "checkout.per-user";r=42;t=18
//
// where the item names the rule as "<policy>.<rule>", q and w are the
// rule's requests and period in seconds, r the remaining quota and t the
// seconds until reset. A deny adds Retry-After (whole seconds, rounded up,
// at least 1) and an RFC 9457 application/problem+json body.
package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// ProblemType is the type URI of floodgate's problem details.
const (
	ProblemRateLimited = "https://floodgate.dev/problems/rate-limited"
	ProblemUnavailable = "https://floodgate.dev/problems/limiter-unavailable"
	ProblemBadRequest  = "https://floodgate.dev/problems/bad-request"
	ProblemNoConfig    = "https://floodgate.dev/problems/no-config"
	ProblemUpstream    = "https://floodgate.dev/problems/upstream-unreachable"
)

// Options configure a Proxy.
type Options struct {
	// Upstream is the application, e.g. http://127.0.0.1:8080. Required.
	Upstream *url.URL
	// UpstreamH2C speaks HTTP/2 without TLS (h2c) to the upstream, for
	// gRPC applications. Otherwise HTTP/1.1 is used.
	UpstreamH2C bool
	// Transport overrides the upstream transport (tests).
	Transport http.RoundTripper
	// Engine decides requests. Required.
	Engine *engine.Engine
	// Metrics receives request counts. Required.
	Metrics *metrics.Metrics
	// Events receives deny events; nil disables them.
	Events *events.Queue
	// Log receives upstream errors; nil uses slog.Default().
	Log *slog.Logger
}

// Proxy is the HTTP handler. It is safe for concurrent use; SetRules may
// be called at any time and applies to requests that start afterwards.
type Proxy struct {
	o     Options
	rules atomic.Pointer[ruleset.Set]
	rp    *httputil.ReverseProxy
	pool  sync.Pool

	proxied, denied, unavailable, rejected, upstreamErr prometheus.Counter
}

// New returns a Proxy. It answers 503 until SetRules is called.
func New(o Options) (*Proxy, error) {
	if o.Upstream == nil || o.Engine == nil || o.Metrics == nil {
		return nil, errors.New("proxy: Upstream, Engine and Metrics are required")
	}
	if o.Upstream.Scheme != "http" && o.Upstream.Scheme != "https" {
		return nil, errors.New("proxy: upstream scheme must be http or https")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Transport == nil {
		o.Transport = NewTransport(o.UpstreamH2C)
	}
	p := &Proxy{o: o}
	p.pool.New = func() any { return new(State) }
	up := o.Upstream
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// The application sees the Host the client asked for.
			pr.Out.Host = pr.In.Host
			// Keep the client's chain and append the peer, as a proxy does.
			// Whether the chain is believed is the rules' business
			// (trustedProxies), not the application's.
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
		},
		Transport:  o.Transport,
		BufferPool: bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				// The client went away; nobody is listening.
				return
			}
			p.upstreamErr.Inc()
			o.Log.Warn("upstream request failed", "err", err, "method", r.Method, "path", r.URL.Path)
			problem(w, http.StatusBadGateway, ProblemUpstream, "Bad Gateway", "the application did not answer", 0)
		},
	}
	rt := o.Metrics.RequestsTotal
	p.proxied = rt.WithLabelValues("proxied")
	p.denied = rt.WithLabelValues("denied")
	p.unavailable = rt.WithLabelValues("unavailable")
	p.rejected = rt.WithLabelValues("rejected")
	p.upstreamErr = rt.WithLabelValues("upstream_error")
	return p, nil
}

// NewTransport returns the upstream transport: keep-alive connections to
// one local application, no transparent compression (the client's
// Accept-Encoding is passed through as is), and h2c when asked.
func NewTransport(h2c bool) *http.Transport {
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	if h2c {
		var ps http.Protocols
		ps.SetUnencryptedHTTP2(true)
		t.Protocols = &ps
	}
	return t
}

// SetRules installs a compiled rule set.
func (p *Proxy) SetRules(s *ruleset.Set) { p.rules.Store(s) }

// Rules returns the rule set in force, or nil.
func (p *Proxy) Rules() *ruleset.Set { return p.rules.Load() }

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := p.pool.Get().(*State)
	defer p.release(st)
	d := p.Check(r, st)
	if d.Rule != nil {
		writeFields(w.Header(), d.Rule, d.Result, d.Outcome != Allowed)
	}
	switch d.Outcome {
	case Pass, Allowed:
		p.rp.ServeHTTP(w, r)
	case NoConfig:
		NotReady(w)
	default:
		ps := d.problem()
		problem(w, ps.status, ps.typ, ps.title, ps.detail(), ps.retry)
	}
}

func (p *Proxy) release(st *State) {
	st.reset()
	p.pool.Put(st)
}

// writeFields sets the rate-limit response fields of the binding rule.
func writeFields(h http.Header, rule *ruleset.Rule, res engine.Result, denied bool) {
	// Every value is a slice of one string built in one buffer, and the
	// five header slices share one backing array: two allocations per
	// response instead of ten.
	var buf [160]byte
	b, ends := fieldValues(buf[:0], rule, res, denied)
	all := string(b)
	vals := make([]string, 5)
	begin := 0
	for i, end := range ends {
		vals[i] = all[begin:end]
		begin = end
	}
	h["X-Ratelimit-Limit"] = vals[0:1:1]
	h["X-Ratelimit-Remaining"] = vals[1:2:2]
	h["X-Ratelimit-Reset"] = vals[2:3:3]
	h["Ratelimit-Policy"] = vals[3:4:4]
	h["Ratelimit"] = vals[4:5:5]
}

// fieldValues appends the values of the five response fields (in
// fieldNames' order) to b, and returns where each ends. Names are
// restricted to [A-Za-z0-9._-], so quoting them needs no escapes.
func fieldValues(b []byte, rule *ruleset.Rule, res engine.Result, denied bool) ([]byte, [5]int) {
	reset := res.ResetAfter
	if res.RetryAfter > reset {
		reset = res.RetryAfter
	}
	resetSec := ceilSeconds(reset, 0)
	remaining := res.Remaining
	if denied {
		remaining = 0
	}
	lim := rule.Engine.Limit
	var ends [5]int
	b = strconv.AppendInt(b, res.Limit, 10)
	ends[0] = len(b)
	b = strconv.AppendInt(b, remaining, 10)
	ends[1] = len(b)
	b = strconv.AppendInt(b, resetSec, 10)
	ends[2] = len(b)
	b = strconv.AppendQuote(b, rule.PolicyName)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, lim.Requests, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, int64(lim.Period/time.Second), 10)
	ends[3] = len(b)
	b = strconv.AppendQuote(b, rule.PolicyName)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, resetSec, 10)
	ends[4] = len(b)
	return b, ends
}

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, floor)
}

// problem writes an RFC 9457 problem+json answer. retry > 0 adds a
// Retry-After of at least one second.
func problem(w http.ResponseWriter, status int, typ, title, detail string, retry time.Duration) {
	h := w.Header()
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	ps := problemSpec{status: status, typ: typ, title: title, d0: detail}
	var secs int64
	if retry > 0 {
		secs = ceilSeconds(retry, 1)
	}
	b := appendProblemBody(make([]byte, 0, 256), &ps, secs)
	// Content-Length and Retry-After share one string and one backing
	// array.
	var nb [40]byte
	n := strconv.AppendInt(nb[:0], int64(len(b)), 10)
	cl := len(n)
	if retry > 0 {
		n = strconv.AppendInt(n, secs, 10)
	}
	all := string(n)
	vals := []string{all[:cl], all[cl:]}
	h["Content-Length"] = vals[0:1:1]
	if retry > 0 {
		h["Retry-After"] = vals[1:2:2]
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// The constant header values of a problem answer, shared by all: their
// capacity equals their length, so an append to one copies it.
var (
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
)

// appendJSONString appends s as a JSON string. Control characters and
// non-ASCII bytes are escaped, so the output is valid JSON whatever s holds.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONEscaped(b, s)
	return append(b, '"')
}

// appendJSONEscaped appends s escaped for a JSON string, without quotes.
func appendJSONEscaped(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c >= 0x7f:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return b
}

// bufferPool lends ReverseProxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Get implements httputil.BufferPool.
func (bufferPool) Get() []byte { return *(buffers.Get().(*[]byte)) }

// Put implements httputil.BufferPool.
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// NotReady answers a request that arrives before any config is loaded:
// 503 with Retry-After, as a fail-closed sidecar should.
func NotReady(w http.ResponseWriter) {
	problem(w, http.StatusServiceUnavailable, ProblemNoConfig, "Service Unavailable", "the rate limiter has no configuration yet", time.Second)
}
