package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/shedder"
)

// Outcome is what the sidecar does with a request.
type Outcome uint8

// The outcomes of Check.
const (
	// Pass proxies a request that no rule keyed, without response fields.
	Pass Outcome = iota
	// Allowed proxies a request the rules admitted, with the fields of
	// the binding rule.
	Allowed
	// Denied answers 429.
	Denied
	// Unavailable answers 503: a fail-closed rule's store is unreachable.
	Unavailable
	// Rejected answers 400: a key part a rule requires, or the cost, is
	// missing or malformed.
	Rejected
	// NoConfig answers 503: no config has been loaded yet.
	NoConfig
	// Unauthorized answers 401 with WWW-Authenticate: a rule keys on a
	// jwtClaim and the request's bearer token does not verify (forged,
	// expired, of another issuer), and the policy does not key such
	// requests by the next alternative.
	Unauthorized
	// TooLarge answers 431: the request's header block is larger than
	// Options.MaxHeaderBytes. ServeHTTP decides it; another front bounds
	// the head as it reads it.
	TooLarge
)

// Decision is the result of Check. It lives in a State and is valid until
// the State is used again.
type Decision struct {
	Outcome Outcome
	// Rule is the binding rule whose fields the response carries, or nil.
	Rule *ruleset.Rule
	// Result is the binding rule's result.
	Result engine.Result
	// Binding is what the response fields report, set with Rule.
	Binding ratelimitheaders.Binding
	// Detail explains a Rejected request.
	Detail string
	// Slot is the concurrency rule that refused the request
	// (ConcurrencyDenied, ConcurrencyUnavailable), with the requests of
	// its key InFlight when it did.
	Slot     *ruleset.ConcurrencyRule
	InFlight int64
	// Priority is the class of a Shed request.
	Priority shedder.Priority

	adm *admission // what an admitted request holds; see Finish
}

// State is the scratch space of one request's check. It is not safe for
// concurrent use; a connection may keep one and reuse it for each of its
// requests.
type State struct {
	ruleset.Scratch
	v   engine.Verdict
	d   Decision
	adm admission // concurrency slots and the shedder (admission.go)

	// Sleep, when a front sets it, holds a request that waits for a
	// delayed slot: it returns after d, or early and false when the client
	// goes away (engine.Await). The net/http front needs none: its
	// request's context ends when the client goes.
	Sleep func(ctx context.Context, d time.Duration) bool
}

func (st *State) reset() {
	st.adm.finish()
	st.Request.Reset(nil, "", 0)
	clear(st.Hits)
	st.d = Decision{}
}

// Reset ends the request checked with st: it gives back what Finish gives
// back and drops the request's references to the rules in force (its
// hits and its Decision, which is invalid afterwards). A front that keeps
// a State between requests calls it after each one, so that an idle
// connection does not keep alive a rule set that a config change has
// replaced.
func (st *State) Reset() { st.reset() }

// fit drops st's buffers when they are sized for a much larger rule set
// than set, as after a config change that left fewer rules (see
// ruleset.Scratch.Fit).
func (st *State) fit(set *ruleset.Set) {
	if st.Fit(set) {
		st.v = engine.Verdict{}
	}
}

// Check matches r to the rules in force, keys it, asks the engine, counts
// the outcome in requests_total and queues the deny events. It is the
// decision of ServeHTTP, open to another HTTP front: r needs only Method,
// URL.Path, URL.RawQuery, Header (with canonical names), Host and
// RemoteAddr. The returned Decision lives in st.
func (p *Proxy) Check(r *http.Request, st *State) *Decision {
	d := p.check(r, st)
	if p.o.Checked != nil && d.Outcome != NoConfig {
		p.o.Checked(checked(p.rules.Load(), r, st, d))
	}
	return d
}

// Checked is what a decision of Check was taken on, for Options.Checked.
type Checked struct {
	// Method and Path are the request's method and the path the rules
	// matched (match.MatchPath of the request's).
	Method, Path string
	// Rules are the PolicyName of each rule that counted the request, and
	// Keys its counter key, in the same order.
	Rules, Keys []string
	// Outcome is the decision's.
	Outcome Outcome
}

// checked copies what Options.Checked is told out of r and st, which the
// front reuses. Only an outcome the rules were evaluated for has hits.
func checked(set *ruleset.Set, r *http.Request, st *State, d *Decision) Checked {
	c := Checked{Method: strings.Clone(r.Method), Path: match.MatchPath(r.URL.Path), Outcome: d.Outcome}
	switch d.Outcome {
	case Pass, Allowed, Denied, Unavailable:
	default:
		return c
	}
	for i, h := range st.Hits {
		if set != nil && i < len(st.Rules) && st.Rules[i] < len(set.Rules) {
			c.Rules = append(c.Rules, set.Rules[st.Rules[i]].PolicyName)
		}
		c.Keys = append(c.Keys, strings.Clone(h.Key))
	}
	return c
}

func (p *Proxy) check(r *http.Request, st *State) *Decision {
	d := &st.d
	// A request a front did not Finish gives its slots back here.
	st.adm.finish()
	*d = Decision{}
	if why := vetRequest(r); why != "" {
		p.reject(d, errors.New(why), "")
		return d
	}
	set := p.rules.Load()
	if set == nil {
		p.unavailable.Inc()
		d.Outcome = NoConfig
		return d
	}
	st.fit(set)
	st.Request.Reset(r, match.MatchPath(r.URL.Path), set.Policies)
	if !p.classify(set, st, d) {
		return d
	}
	if err := set.Evaluate(&st.Scratch); err != nil {
		rule := ""
		var rej *ruleset.RejectError
		var cost *ruleset.CostError
		if errors.As(err, &rej) && !errors.As(err, &cost) {
			// A key the rule could not take: name the rule.
			rule = rej.Rule.PolicyName
		}
		p.reject(d, err, rule)
		return d
	}
	if !p.keySlots(set, st, d) || !p.acquireSlots(set, r, st, d) {
		return d
	}
	if len(st.Hits) == 0 {
		if !p.enter(r.Context(), st, d) {
			return d
		}
		p.proxied.Inc()
		d.Outcome = Pass
		return d
	}
	v := &st.v
	p.o.Engine.Decide(r.Context(), st.Hits, v)
	if v.Outcome == engine.Allow && v.Wait > 0 {
		if !p.await(r, st) {
			// Refused after all: the rule's waiting bound was reached,
			// or the client went away. Its slots went back.
			v.Outcome = engine.Deny
			if v.Binding >= 0 {
				v.Results[v.Binding].RetryAfter = max(time.Second, v.RetryAfter)
			}
		} else if !p.acquireSlots(set, r, st, d) {
			return d
		}
	}
	if v.Outcome != engine.Allow {
		st.abortAdmission()
	}
	if v.Binding >= 0 {
		rule := &set.Rules[st.Rules[v.Binding]]
		d.Rule, d.Result = rule, v.Results[v.Binding]
		d.Binding = ratelimitheaders.Bind(rule.PolicyName, rule.Engine.Limit, rule.Fields, d.Result.Decision, v.Outcome != engine.Allow)
	}
	p.publish(r, st, v)
	if v.Outcome == engine.Allow && !p.enter(r.Context(), st, d) {
		return d
	}
	switch v.Outcome {
	case engine.Allow:
		p.proxied.Inc()
		d.Outcome = Allowed
	case engine.Deny:
		p.denied.Inc()
		d.Outcome = Denied
	default:
		p.unavailable.Inc()
		d.Outcome = Unavailable
	}
	return d
}

// DefaultMaxDelayed is Options.MaxDelayed's default.
const DefaultMaxDelayed = 10_000

// await holds a request that delaying rules admitted with a wait until its
// reserved slots come (engine.Await: a runtime timer, counted per rule
// and bounded by Options.MaxDelayed). Meanwhile it holds no concurrency
// slot and has no place in the shedder: it takes them again when it goes
// on. It reports false, with the slots given back to the store, when the
// rule's bound is reached or the client goes away (the request's context
// ends, or State.Sleep says so). v.RetryAfter is then set for the answer.
func (p *Proxy) await(r *http.Request, st *State) bool {
	st.adm.sv.Held.Release()
	wait := st.v.Wait
	limit := p.o.MaxDelayed
	if limit == 0 {
		limit = DefaultMaxDelayed
	}
	if p.o.Engine.Await(r.Context(), st.Hits, &st.v, limit, st.Sleep) == engine.Released {
		return true
	}
	st.v.RetryAfter = wait
	return false
}

// publish queues a deny event for each denying hit, shadow ones included.
// When the log would not write them, the events are counted, not built.
func (p *Proxy) publish(r *http.Request, st *State, v *engine.Verdict) {
	if p.o.Events == nil {
		return
	}
	logging := p.o.Events.Logging()
	for i := range v.Results {
		if !events.Denied(&v.Results[i]) {
			continue
		}
		if !logging {
			p.o.Events.Publish(events.Event{})
			continue
		}
		p.o.Events.Publish(events.Deny(time.Now(), &st.Hits[i], &v.Results[i], r.Method, r.URL.Path, r.RemoteAddr))
	}
}

// UpstreamFailed counts and logs a request the application did not
// answer; the caller answers it with AppendProblem's 502.
func (p *Proxy) UpstreamFailed(err error, method, path string) {
	p.upstreamErr.Inc()
	p.o.Log.Warn("upstream request failed", "err", err, "method", events.Clip(method), "path", events.Clip(path))
}

// reject makes d the answer to a request whose key or cost could not be
// read (err), naming rule unless empty: Unauthorized for a bearer token
// that does not verify, Rejected otherwise.
func (p *Proxy) reject(d *Decision, err error, rule string) {
	p.rejected.Inc()
	d.Outcome, d.Detail = Rejected, err.Error()
	if rule != "" {
		d.Detail += " (rule " + rule + ")"
	}
	var bad *descriptor.InvalidTokenError
	if errors.As(err, &bad) {
		d.Outcome = Unauthorized
	}
}

// problemSpec is the problem answer of a decision.
type problemSpec struct {
	status             int
	typ, title         string
	d0, d1, d2, d3, d4 string // the detail, in parts
	secs               int64  // Retry-After and retryAfter, in seconds; 0 for none
}

// detail is the problem's detail in one string.
func (ps *problemSpec) detail() string { return ps.d0 + ps.d1 + ps.d2 + ps.d3 + ps.d4 }

// problem is the problem answer of a decision that is not proxied.
func (d *Decision) problem() problemSpec {
	switch d.Outcome {
	case Denied:
		r := d.Rule.Engine
		ps := problemSpec{status: http.StatusTooManyRequests, typ: ProblemRateLimited, title: "Too Many Requests",
			d0: "rate limit of policy ", d1: r.Policy, d2: ", rule ", d3: r.Name, d4: " exceeded", secs: d.Binding.RetrySeconds()}
		return d.quiet(ps, "rate limit exceeded")
	case Unavailable:
		r := d.Rule.Engine
		ps := problemSpec{status: http.StatusServiceUnavailable, typ: ProblemUnavailable, title: titleUnavailable,
			d0: "the counter store for policy ", d1: r.Policy, d2: ", rule ", d3: r.Name,
			d4: " is unreachable and the rule fails closed", secs: d.Binding.RetrySeconds()}
		return d.quiet(ps, "the counter store is unreachable and the rule fails closed")
	case Rejected:
		return problemSpec{status: http.StatusBadRequest, typ: ProblemBadRequest, title: "Bad Request", d0: d.Detail}
	case ConcurrencyDenied, ConcurrencyUnavailable, Shed:
		return d.admissionProblem()
	case Unauthorized:
		return problemSpec{status: http.StatusUnauthorized, typ: ProblemBadToken, title: "Unauthorized", d0: d.Detail}
	case TooLarge:
		return problemSpec{status: http.StatusRequestHeaderFieldsTooLarge, typ: ProblemTooLarge, title: "Request Header Fields Too Large", d0: d.Detail}
	case NoConfig:
		return problemSpec{status: http.StatusServiceUnavailable, typ: ProblemNoConfig, title: titleUnavailable,
			d0: "the rate limiter has no configuration yet", secs: ratelimitheaders.RetrySeconds(time.Second)}
	case AtCapacity:
		return problemSpec{status: http.StatusServiceUnavailable, typ: ProblemAtCapacity, title: titleUnavailable,
			d0: d.Detail, secs: ratelimitheaders.RetrySeconds(time.Second)}
	}
	return problemSpec{status: http.StatusBadGateway, typ: ProblemUpstream, title: "Bad Gateway", d0: "the application did not answer"}
}

// quiet trims the problem of a refusal by a rule whose numbers are hidden
// (responseHeaders RetryAfter or None): its detail names neither the
// policy nor the rule, whose names an operator may have made of the
// numbers ("login-5-per-minute"), and under None the body does not carry
// retryAfter either, as the answer carries no Retry-After. detail is
// the detail then.
func (d *Decision) quiet(ps problemSpec, detail string) problemSpec {
	switch d.Rule.Fields {
	case ratelimitheaders.ModeFull:
		return ps
	case ratelimitheaders.ModeNone:
		ps.secs = 0
	}
	ps.d0, ps.d1, ps.d2, ps.d3, ps.d4 = detail, "", "", "", ""
	return ps
}

// UpstreamError is the Decision whose AppendProblem is the 502 answer to a
// request the application did not answer.
var UpstreamError = Decision{Outcome: 0xff}

// AppendFields appends the response fields the binding rule sends (see
// ratelimitheaders.Binding.Span), each as a "Name: value\r\n" line
// (Retry-After among them when the rule refused the request and its mode
// sends it), or nothing when the decision has no binding rule.
func AppendFields(b []byte, d *Decision) []byte {
	if d.Rule == nil {
		return b
	}
	var vals [192]byte
	v, ends, lo, hi := ratelimitheaders.Append(vals[:0], &d.Binding)
	begin := 0
	for f := lo; f < hi; f++ {
		b = append(b, fieldNames[f]...)
		b = append(b, ": "...)
		b = append(b, v[begin:ends[f]]...)
		b = append(b, "\r\n"...)
		begin = ends[f]
	}
	return b
}

// AppendProblem appends the whole HTTP/1.1 answer of a decision that is
// not proxied (Denied, Unavailable, Rejected, NoConfig, AtCapacity, or
// UpstreamError): status line, the problem fields, the rate-limit fields,
// date (an HTTP date, or nil for none), "Connection: close" when closing,
// and the problem+json body. It allocates nothing when b has room.
func AppendProblem(b []byte, d *Decision, date []byte, closing bool) []byte {
	ps := d.problem()
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(ps.status), 10)
	b = append(b, ' ')
	b = append(b, ps.title...)
	b = append(b, "\r\nCache-Control: no-store\r\nContent-Type: application/problem+json\r\n"...)
	if d.Outcome == Unauthorized {
		b = append(b, "WWW-Authenticate: "...)
		b = append(b, invalidTokenChallenge[0]...)
		b = append(b, "\r\n"...)
	}
	if d.Rule != nil {
		b = AppendFields(b, d) // Retry-After among them
	} else if ps.secs > 0 {
		b = append(b, "Retry-After: "...)
		b = strconv.AppendInt(b, ps.secs, 10)
		b = append(b, "\r\n"...)
	}
	if date != nil {
		b = append(b, "Date: "...)
		b = append(b, date...)
		b = append(b, "\r\n"...)
	}
	if closing {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	// The body goes after the head; its length is known once it is
	// written, so it is appended first at the end and the length put in
	// front of it by one move.
	lenAt := len(b)
	b = appendProblemBody(b, &ps)
	bodyLen := len(b) - lenAt
	var nb [20]byte
	n := strconv.AppendInt(nb[:0], int64(bodyLen), 10)
	shift := len(n) + 4 // the digits and "\r\n\r\n"
	for range shift {
		b = append(b, 0)
	}
	copy(b[lenAt+shift:], b[lenAt:lenAt+bodyLen])
	copy(b[lenAt:], n)
	copy(b[lenAt+len(n):], "\r\n\r\n")
	return b
}

// appendProblemBody appends the RFC 9457 body of a problem answer.
func appendProblemBody(b []byte, ps *problemSpec) []byte {
	b = append(b, `{"type":`...)
	b = strconv.AppendQuote(b, ps.typ)
	b = append(b, `,"title":`...)
	b = strconv.AppendQuote(b, ps.title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(ps.status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONParts(b, ps.d0, ps.d1, ps.d2, ps.d3, ps.d4)
	if ps.secs > 0 {
		b = append(b, `,"retryAfter":`...)
		b = strconv.AppendInt(b, ps.secs, 10)
	}
	return append(b, "}\n"...)
}

// appendJSONParts appends the concatenation of parts as one JSON string.
func appendJSONParts(b []byte, parts ...string) []byte {
	b = append(b, '"')
	for _, s := range parts {
		b = appendJSONEscaped(b, s)
	}
	return append(b, '"')
}
