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
// fields of the binding rule (see package engine), as package
// ratelimitheaders computes them for both of the sidecar's fronts:
// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, and the
// RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-09:
//
//	RateLimit-Policy: "checkout.per-user";q=100;w=60
//	RateLimit: "checkout.per-user";r=42;t=18
//
// A deny adds Retry-After (whole seconds, rounded up, at least 1) and an
// RFC 9457 application/problem+json body.
//
// # gRPC
//
// A gRPC call (Content-Type application/grpc) that the sidecar refuses is
// answered as gRPC, not as HTTP: a Trailers-Only answer with grpc-status 8
// (RESOURCE_EXHAUSTED) for a deny, grpc-retry-pushback-ms, and the
// rate-limit fields in the trailers (ratelimitheaders.GRPCRefusal). A gRPC
// client reads a bare HTTP 429 as UNAVAILABLE and retries it at once.
//
// # The path the application sees
//
// Rules match the cleaned path (match.CleanPath: "/a/../admin" is
// "/admin"). When cleaning changes the path, the application is sent the
// cleaned path, so that it serves the path the rules matched and not
// another one its router would make of the raw path.
//
// # Header size
//
// With Options.MaxHeaderBytes, a request whose header block (request line
// and fields, as sent on HTTP/1.1) is larger is answered 431, exactly at
// the bound.
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
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// ProblemType is the type URI of floodgate's problem details.
const (
	ProblemRateLimited = "https://floodgate.dev/problems/rate-limited"
	ProblemUnavailable = "https://floodgate.dev/problems/limiter-unavailable"
	ProblemBadRequest  = "https://floodgate.dev/problems/bad-request"
	ProblemNoConfig    = "https://floodgate.dev/problems/no-config"
	ProblemUpstream    = "https://floodgate.dev/problems/upstream-unreachable"
	ProblemBadToken    = "https://floodgate.dev/problems/invalid-token"
	ProblemTooLarge    = "https://floodgate.dev/problems/header-too-large"
)

// Options configure a Proxy.
type Options struct {
	// Upstream is the application, e.g. http://127.0.0.1:8080. Required.
	Upstream *url.URL
	// MaxDelayed bounds, per delaying rule (onExceed: Delay), the requests
	// that wait in this sidecar for their slot; the next one is refused
	// (429) and gives its slot back. 0 means DefaultMaxDelayed.
	MaxDelayed int64
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
	// MaxHeaderBytes, when positive, answers 431 to a request whose
	// header block is larger (see HeaderSize).
	MaxHeaderBytes int
	// BodyTimeout, when positive, is how long each BodyWindow bytes of a
	// request body, and its last part, may take to arrive; a body that
	// stalls or trickles is cut off and the application sees it end
	// early.
	BodyTimeout time.Duration
	// BodyMinRate, when positive, is the slowest a request body may
	// arrive, in bytes per second over each window (see NewBodyPace).
	BodyMinRate int64
	// AllowUnderscoreHeaders forwards, and lets the rules read, header
	// fields whose names contain an underscore; by default both fronts
	// drop them (see UnderscoreName).
	AllowUnderscoreHeaders bool
	// Checked, when set, is told of every decision Check makes with the
	// rules in force, after it makes it: what a harness compares with
	// what the application parsed. It runs on the request's goroutine.
	Checked func(Checked)
}

// Proxy is the HTTP handler. It is safe for concurrent use; SetRules may
// be called at any time and applies to requests that start afterwards.
type Proxy struct {
	o     Options
	pace  BodyPace
	rules atomic.Pointer[ruleset.Set]
	rp    *httputil.ReverseProxy
	pool  sync.Pool

	proxied, denied, unavailable, rejected, upstreamErr prometheus.Counter
	adm                                                 admissionCounters
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
	if o.BodyTimeout > 0 {
		p.pace = NewBodyPace(o.BodyTimeout, o.BodyMinRate)
	}
	p.pool.New = func() any { return new(State) }
	up := o.Upstream
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The application serves the path the rules matched.
			if clean := match.CleanPath(pr.In.URL.Path); clean != pr.In.URL.Path {
				pr.Out.URL.Path, pr.Out.URL.RawPath = clean, ""
			}
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
			upstreamFailed(w)
			if errors.Is(err, ErrBodyTimeout) || bodyTimedOut(r) {
				// The client, not the application, failed: as the lean
				// core answers it.
				p.rejected.Inc()
				w.Header().Set("Connection", "close")
				http.Error(w, ErrBodyTimeout.Error(), http.StatusRequestTimeout)
				return
			}
			if errors.Is(err, context.Canceled) {
				// The client went away; nobody is listening.
				return
			}
			p.UpstreamFailed(err, r.Method, r.URL.Path)
			ps := UpstreamError.problem()
			problem(w, r, nil, &ps)
		},
	}
	rt := o.Metrics.RequestsTotal
	p.proxied = rt.WithLabelValues("proxied")
	p.denied = rt.WithLabelValues("denied")
	p.unavailable = rt.WithLabelValues("unavailable")
	p.rejected = rt.WithLabelValues("rejected")
	p.upstreamErr = rt.WithLabelValues("upstream_error")
	p.initAdmission()
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
func (p *Proxy) SetRules(s *ruleset.Set) {
	p.configureShedding(s)
	p.rules.Store(s)
}

// Rules returns the rule set in force, or nil.
func (p *Proxy) Rules() *ruleset.Set { return p.rules.Load() }

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if max := p.o.MaxHeaderBytes; max > 0 && HeaderSize(r) > max {
		// net/http lets up to 4096 bytes more through; the bound is
		// exact here.
		p.rejected.Inc()
		ps := (&Decision{Outcome: TooLarge, Detail: "the request header block is larger than " + strconv.Itoa(max) + " bytes"}).problem()
		problem(w, r, nil, &ps)
		return
	}
	stripUpgrade(r.Header)
	dropUnforwarded(r.Header, p.o.AllowUnderscoreHeaders)
	r = timeBody(w, r, p.pace)
	if strings.IndexByte(r.RequestURI, '#') >= 0 {
		// As the lean core's parser refuses it (h1): a request-target
		// has no fragment, and servers that cut it off route "/admin#x"
		// as "/admin".
		p.rejected.Inc()
		ps := (&Decision{Outcome: Rejected, Detail: "a fragment (#) in the request target"}).problem()
		problem(w, r, nil, &ps)
		return
	}
	st := p.pool.Get().(*State)
	defer p.release(st)
	d := p.Check(r, st)
	switch d.Outcome {
	case Pass:
		p.rp.ServeHTTP(d.writer(w), r)
		d.Finish()
	case Allowed:
		if d.Rule != nil {
			setFields(w.Header(), &d.Binding)
		}
		p.rp.ServeHTTP(d.writer(w), r)
		d.Finish()
	default:
		ps := d.problem()
		if d.Rule != nil {
			refuse(w, r, &d.Binding, &ps)
			return
		}
		var challenge []string
		if d.Outcome == Unauthorized {
			// RFC 6750: the token is the problem, not the request.
			challenge = invalidTokenChallenge
		}
		problem(w, r, challenge, &ps)
	}
}

// stripUpgrade removes a request's Upgrade field unless it asks for
// WebSocket alone, so that the request goes on as a plain one. After a 101
// the connection is a tunnel the sidecar no longer reads: a WebSocket
// carries messages, decided as the one request that opened it, but an
// upgrade to h2c or another HTTP would carry further requests that no rule
// checks. A server may ignore an Upgrade it does not want (RFC 9110
// §7.8), as the application now does.
func stripUpgrade(h http.Header) {
	up := h["Upgrade"]
	if len(up) == 0 || len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), "websocket") {
		return
	}
	delete(h, "Upgrade")
}

func (p *Proxy) release(st *State) {
	st.reset()
	p.pool.Put(st)
}

// fieldNames are the response fields' names in http.Header's canonical
// form (the form net/http writes them in, which the lean front writes
// too), then Content-Length: the headers of a refusal, in the order their
// values are built.
var fieldNames = func() (n [ratelimitheaders.NumFields + 1]string) {
	for i, name := range ratelimitheaders.Names {
		n[i] = http.CanonicalHeaderKey(name)
	}
	n[ratelimitheaders.NumFields] = "Content-Length"
	return n
}()

// setFields sets the response fields of b on h.
func setFields(h http.Header, b *ratelimitheaders.Binding) {
	var buf [192]byte
	out, ends, lo, hi := ratelimitheaders.Append(buf[:0], b)
	if lo == hi {
		return
	}
	setValues(h, string(out), ends[lo:hi], fieldNames[lo:hi])
}

// setValues sets header names[i] to the piece of all that ends at
// ends[i]. Every value is a slice of one string and the slices share one
// backing array: two allocations for all the headers instead of two each.
// Each slice's capacity is its length, so an append to one copies it.
func setValues(h http.Header, all string, ends []int, names []string) {
	vals := make([]string, len(ends))
	begin := 0
	for i, end := range ends {
		vals[i] = all[begin:end]
		h[names[i]] = vals[i : i+1 : i+1]
		begin = end
	}
}

// HeaderSize is the size of r's header block as HTTP/1.1 sends it: the
// request line, each field as "Name: value" and CRLF (Host included), and
// the empty line that ends the block. It is what --max-header-bytes
// bounds, for HTTP/2 requests as well.
func HeaderSize(r *http.Request) int {
	uri := r.RequestURI
	if uri == "" {
		uri = r.URL.RequestURI()
	}
	n := len(r.Method) + 1 + len(uri) + 1 + len(r.Proto) + 2
	if r.Host != "" {
		n += len("Host: ") + len(r.Host) + 2
	}
	for name, vs := range r.Header {
		for _, v := range vs {
			n += len(name) + 2 + len(v) + 2
		}
	}
	return n + 2
}

// WriteGRPCRefusal answers a gRPC call that the sidecar refuses with the
// HTTP status status: a Trailers-Only gRPC answer whose trailers carry the
// gRPC status for it (ratelimitheaders.GRPCStatus), msg, the retry
// pushback when retry is positive, and b's rate-limit fields when b is not
// nil.
func WriteGRPCRefusal(w http.ResponseWriter, b *ratelimitheaders.Binding, status int, msg string, retry time.Duration) {
	var buf [20]string
	pairs := ratelimitheaders.GRPCRefusal(buf[:0], b, ratelimitheaders.GRPCStatus(status), msg, retry)
	h := w.Header()
	h["Content-Type"] = grpcContentType
	for i := 0; i+1 < len(pairs); i += 2 {
		h[pairs[i]] = pairs[i+1 : i+2 : i+2]
	}
	w.WriteHeader(http.StatusOK)
}

// isGRPC reports whether r is a gRPC call.
func isGRPC(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	return len(ct) == 1 && ratelimitheaders.IsGRPC(ct[0])
}

// refuse answers a request that binding b refused: the response fields b
// sends (Retry-After among them unless its mode is ModeNone), and the
// problem+json body ps, whose retryAfter is the Retry-After field; for a
// gRPC call, the gRPC answer.
func refuse(w http.ResponseWriter, r *http.Request, b *ratelimitheaders.Binding, ps *problemSpec) {
	if isGRPC(r) {
		WriteGRPCRefusal(w, b, ps.status, ps.detail(), time.Duration(b.RetrySeconds())*time.Second)
		return
	}
	body := appendProblemBody(make([]byte, 0, 256), ps)
	// The fields and Content-Length share one string and one backing
	// array.
	var buf [224]byte
	out, fe, lo, hi := ratelimitheaders.Append(buf[:0], b)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	n := int(hi - lo)
	var ends [ratelimitheaders.NumFields + 1]int
	copy(ends[:], fe[lo:hi])
	ends[n] = len(out)
	var names [ratelimitheaders.NumFields + 1]string
	copy(names[:], fieldNames[lo:hi])
	names[n] = "Content-Length"
	h := w.Header()
	setValues(h, string(out), ends[:n+1], names[:n+1])
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(ps.status)
	_, _ = w.Write(body)
}

// problem writes an RFC 9457 problem+json answer that no rule's fields go
// with, or the gRPC answer to a gRPC call; ps.secs > 0 adds a Retry-After
// of that many seconds. challenge, when not nil, is the WWW-Authenticate
// field.
func problem(w http.ResponseWriter, r *http.Request, challenge []string, ps *problemSpec) {
	if challenge != nil {
		w.Header()["Www-Authenticate"] = challenge
	}
	if isGRPC(r) {
		WriteGRPCRefusal(w, nil, ps.status, ps.detail(), time.Duration(ps.secs)*time.Second)
		return
	}
	body := appendProblemBody(make([]byte, 0, 256), ps)
	var buf [40]byte
	out := strconv.AppendInt(buf[:0], int64(len(body)), 10)
	ends := [2]int{len(out)}
	n := 1
	if ps.secs > 0 {
		out = strconv.AppendInt(out, ps.secs, 10)
		ends[1], n = len(out), 2
	}
	h := w.Header()
	setValues(h, string(out), ends[:n], problemHeaders[:n])
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(ps.status)
	_, _ = w.Write(body)
}

// The constant header values of a problem answer, shared by all: their
// capacity equals their length, so an append to one copies it.
var (
	grpcContentType       = []string{ratelimitheaders.GRPCContentType}
	invalidTokenChallenge = []string{`Bearer error="invalid_token"`}
	problemContentType    = []string{"application/problem+json"}
	noStore               = []string{"no-store"}
	problemHeaders        = [2]string{"Content-Length", "Retry-After"}
)

// appendJSONString appends s as a JSON string (see appendJSONEscaped).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONEscaped(b, s)
	return append(b, '"')
}

// appendJSONEscaped appends s escaped for a JSON string, without quotes.
// Valid UTF-8 is written as it is, so a detail in any script reads as
// written; '"', '\\' and control characters are escaped, and so are U+2028
// and U+2029, which JavaScript does not take raw in a string. Each byte of
// invalid UTF-8 becomes U+FFFD, as encoding/json writes it. The output is
// valid JSON and valid UTF-8 whatever s holds.
func appendJSONEscaped(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0 // s[start:i] is pending, to be copied as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}

// bufferPool lends ReverseProxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Get implements httputil.BufferPool.
func (bufferPool) Get() []byte { return *(buffers.Get().(*[]byte)) }

// Put implements httputil.BufferPool.
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// NotReady answers a request that arrives before any config is loaded:
// 503 with Retry-After, as a fail-closed sidecar should (UNAVAILABLE with
// a retry pushback to a gRPC call).
func NotReady(w http.ResponseWriter, r *http.Request) {
	ps := (&Decision{Outcome: NoConfig}).problem()
	problem(w, r, nil, &ps)
}
