package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/shedder"
)

// The outcomes of concurrency rules and of the load shedder. Their values
// stand apart from the other outcomes'.
const (
	// ConcurrencyDenied answers 429: a concurrency rule's slots are all
	// taken.
	ConcurrencyDenied Outcome = 16 + iota
	// ConcurrencyUnavailable answers 503: a fail-closed concurrency rule's
	// store is unreachable.
	ConcurrencyUnavailable
	// Shed answers 503: the load shedder sheds the request's priority.
	Shed
)

// The problem types of concurrency rules and of the load shedder.
const (
	ProblemConcurrencyLimited = "https://floodgate.dev/problems/concurrency-limited"
	ProblemOverloaded         = "https://floodgate.dev/problems/overloaded"
)

// admission is what a request holds between Check and its end: its
// concurrency slots and its place in the shedder. It lives in the State.
type admission struct {
	// scratch of Check
	cidx     []int
	slotHits []engine.SlotHit
	slotRule []int
	sv       engine.SlotVerdict

	// shedding: the request is subject to the shedder, with priority
	// prio; ticket is its place once admitted.
	shedding  bool
	prio      shedder.Priority
	ticket    shedder.Ticket
	shed      *shedder.Shedder
	responded bool

	// the net/http front's ResponseWriter wrapper, reused
	w headWriter
}

// held reports whether the request holds anything to give back.
func (a *admission) held() bool { return a.sv.Held.Len() > 0 || a.ticket.Held() }

// respond tells the shedder that the application answered: the response
// head arrived, so the request leaves the shedder's count and its latency
// is a sample. Later calls do nothing.
func (a *admission) respond() {
	if a.responded {
		return
	}
	a.responded = true
	if a.shed != nil {
		a.shed.Done(&a.ticket, true)
	}
}

// finish gives everything back: the slots, and the shedder's place of a
// request that got no answer (which is no latency sample).
func (a *admission) finish() {
	a.sv.Held.Release()
	if a.shed != nil {
		a.shed.Done(&a.ticket, false)
	}
	a.shedding, a.shed, a.responded, a.ticket = false, nil, false, shedder.Ticket{}
	clear(a.slotHits)
	a.slotHits = a.slotHits[:0]
}

// admissionCounters are the outcomes Check counts for concurrency rules
// and the shedder.
type admissionCounters struct {
	shed              *shedder.Shedder
	concurrencyDenied prometheus.Counter
	shedCount         prometheus.Counter
}

// initAdmission creates the shedder (off until a config turns it on) and
// resolves the counters.
func (p *Proxy) initAdmission() {
	p.adm.shed = shedder.New(p.o.Metrics, nil)
	rt := p.o.Metrics.RequestsTotal
	p.adm.concurrencyDenied = rt.WithLabelValues("concurrency_denied")
	p.adm.shedCount = rt.WithLabelValues("shed")
}

// configureShedding applies a rule set's shedder settings.
func (p *Proxy) configureShedding(s *ruleset.Set) {
	if s == nil || s.Shedding == nil {
		p.adm.shed.Configure(nil)
		return
	}
	c := s.Shedding.Config
	p.adm.shed.Configure(&c)
}

// Shedder returns the proxy's load shedder.
func (p *Proxy) Shedder() *shedder.Shedder { return p.adm.shed }

// classify gives the request its priority and sheds it at once when its
// priority is shed now, before any rule spends anything on it. It reports
// whether the request goes on.
func (p *Proxy) classify(set *ruleset.Set, st *State, d *Decision) bool {
	a := &st.adm
	sh := set.Shedding
	if sh == nil || !p.adm.shed.Enabled() {
		return true
	}
	a.prio, a.cidx = sh.Classify(&st.Request, a.cidx)
	a.shedding = true
	if p.adm.shed.Admits(a.prio) {
		return true
	}
	p.adm.shed.CountShed(a.prio)
	a.shedding = false
	p.adm.shedCount.Inc()
	d.Outcome, d.Priority = Shed, a.prio
	return false
}

// keySlots appends the request's concurrency hits: each concurrency rule
// that matches it, does not exempt it and has a key for it. It reports
// false, with d Rejected, when a key part a rule requires is missing or
// malformed.
func (p *Proxy) keySlots(set *ruleset.Set, st *State, d *Decision) bool {
	a := &st.adm
	if set.ConcurrencyMatcher == nil {
		return true
	}
	a.cidx = set.ConcurrencyMatcher.Match(&st.Request, a.cidx[:0])
	a.slotRule = a.slotRule[:0]
	for _, i := range a.cidx {
		rule := &set.Concurrency[i]
		if rule.Exempt.Holds(&st.Request) {
			rule.Exempted.Inc()
			continue
		}
		key, ok, err := rule.Extract.Key(&st.Request)
		if err != nil {
			p.reject(d, err, rule.PolicyName)
			return false
		}
		if !ok {
			continue
		}
		a.slotHits = append(a.slotHits, engine.SlotHit{Rule: rule.Engine, Key: key})
		a.slotRule = append(a.slotRule, i)
	}
	return true
}

// acquireSlots takes the request's concurrency slots. It reports false,
// with d set, when a rule denies or cannot reach its store.
func (p *Proxy) acquireSlots(set *ruleset.Set, r *http.Request, st *State, d *Decision) bool {
	a := &st.adm
	if len(a.slotHits) == 0 {
		return true
	}
	p.o.Engine.Acquire(r.Context(), a.slotHits, &a.sv)
	switch a.sv.Outcome {
	case engine.Allow:
		return true
	case engine.Deny:
		p.adm.concurrencyDenied.Inc()
		d.Outcome = ConcurrencyDenied
	default:
		p.unavailable.Inc()
		d.Outcome = ConcurrencyUnavailable
	}
	d.Slot = &set.Concurrency[a.slotRule[a.sv.Binding]]
	d.InFlight = a.sv.Results[a.sv.Binding].InFlight
	return false
}

// enter admits a request that the rules admitted into the shedder (a
// Critical one may wait briefly for a place), and attaches what it holds
// to d. It reports false, with d Shed and the slots given back, when the
// shedder sheds it after all (its count rose since classify).
func (p *Proxy) enter(ctx context.Context, st *State, d *Decision) bool {
	a := &st.adm
	if a.shedding {
		t, ok := p.adm.shed.AdmitWait(ctx, a.prio)
		if !ok {
			a.finish()
			p.adm.shedCount.Inc()
			*d = Decision{Outcome: Shed, Priority: a.prio}
			return false
		}
		a.ticket, a.shed = t, p.adm.shed
	}
	if a.held() {
		d.adm = a
	}
	return true
}

// abortAdmission gives back what a request refused after its slots were
// taken holds.
func (st *State) abortAdmission() { st.adm.finish() }

// Responded tells the shedder that the application's response head has
// arrived for an admitted request: it leaves the shedder's count of
// requests in flight, and its latency is a sample. A front calls it when it
// has the head (or the connection is switched, for an upgrade); it is safe
// to call more than once or not at all.
func (d *Decision) Responded() {
	if d.adm != nil {
		d.adm.respond()
	}
}

// Finish ends an admitted request: its response body is complete, its
// client went away, or its stream or upgraded connection ended. It gives
// back the request's concurrency slots and, when no response came, its
// place in the shedder. Every front calls it once the exchange is over; a
// later call does nothing.
func (d *Decision) Finish() {
	if d.adm != nil {
		d.adm.finish()
		d.adm = nil
	}
}

// Holds reports whether the request holds concurrency slots, which the
// front must release when the client goes away.
func (d *Decision) Holds() bool { return d.adm != nil && d.adm.sv.Held.Len() > 0 }

// admissionProblem is the problem answer of a concurrency or shedder
// refusal.
func (d *Decision) admissionProblem() problemSpec {
	secs := ratelimitheaders.RetrySeconds(engine.ConcurrencyRetryAfter)
	switch d.Outcome {
	case ConcurrencyDenied:
		r := d.Slot.Engine
		return problemSpec{status: http.StatusTooManyRequests, typ: ProblemConcurrencyLimited, title: "Too Many Requests",
			d0: "concurrency limit of policy " + r.Policy + ", rule " + r.Name, d1: " reached: ",
			d2: strconv.FormatInt(d.InFlight, 10), d3: " requests in flight, at most ", d4: strconv.FormatInt(r.Max, 10), secs: secs}
	case ConcurrencyUnavailable:
		r := d.Slot.Engine
		return problemSpec{status: http.StatusServiceUnavailable, typ: ProblemUnavailable, title: titleUnavailable,
			d0: "the counter store for policy ", d1: r.Policy, d2: ", rule ", d3: r.Name,
			d4: " is unreachable and the rule fails closed", secs: ratelimitheaders.RetrySeconds(engine.UnavailableRetryAfter)}
	}
	return problemSpec{status: http.StatusServiceUnavailable, typ: ProblemOverloaded, title: titleUnavailable,
		d0: "the service is overloaded and sheds ", d1: d.Priority.String(), d2: " requests; retry later",
		secs: ratelimitheaders.RetrySeconds(shedder.RetryAfter)}
}

// headWriter is the net/http front's ResponseWriter while a request is in
// the shedder: the first final status written, or the switch of protocols
// (Hijack), is the application's response head.
type headWriter struct {
	http.ResponseWriter
	a      *admission
	failed bool // the application did not answer: the 502 is no response
}

func (w *headWriter) head(code int) {
	if code >= 200 && !w.failed {
		w.a.respond()
	}
}

// WriteHeader implements http.ResponseWriter.
func (w *headWriter) WriteHeader(code int) {
	w.head(code)
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *headWriter) Write(b []byte) (int, error) {
	w.head(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Hijack implements http.Hijacker for upgrades: the 101 has come.
func (w *headWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.a.respond()
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// upstreamFailed marks w, when it is a headWriter, as answering for an
// application that did not answer.
func upstreamFailed(w http.ResponseWriter) {
	if hw, ok := w.(*headWriter); ok {
		hw.failed = true
	}
}

// writer returns the ResponseWriter to proxy through: w itself, or the
// reused headWriter when the request is in the shedder.
func (d *Decision) writer(w http.ResponseWriter) http.ResponseWriter {
	if d.adm == nil || !d.adm.ticket.Held() {
		return w
	}
	hw := &d.adm.w
	*hw = headWriter{ResponseWriter: w, a: d.adm}
	return hw
}
