// Package ratelimitheaders computes the rate-limit response fields that
// both of floodgate-sidecar's fronts send: the HTTP proxy on every answer to
// a request an enforced rule matched, and the Envoy rate-limit service in
// response_headers_to_add (with --grpc-response-headers). One function
// computes them, so the two fronts cannot disagree.
//
// The fields describe the binding rule (see package engine):
//
//	X-RateLimit-Limit: 100
//	X-RateLimit-Remaining: 42
//	X-RateLimit-Reset: 18
//	RateLimit-Policy: "checkout.per-user";q=100;w=60
//	RateLimit: "checkout.per-user";r=42;t=18
//	Retry-After: 18
//
// X-RateLimit-Limit is the capacity of the bucket that decided
// (limiter.Decision.Limit): the rule's capacity (its burst, or its requests
// when it has none), or, while the counter store is unreachable and a
// fail-open rule decides on its local share, that share's capacity. It
// always describes the same bucket as X-RateLimit-Remaining and
// X-RateLimit-Reset. RateLimit-Policy is the rule's policy as written,
// requests per period (q, and w in seconds), whichever bucket decided.
// X-RateLimit-Reset and the RateLimit field's t are the seconds until the
// key is back to full, or until the request would be admitted when that is
// later. Remaining reads 0 on a denied request. Retry-After is only sent on
// a denied request. Every duration is rounded up to whole seconds (a client
// that waits what it is told is never early), and Retry-After is at least 1.
// The RateLimit fields are draft-ietf-httpapi-ratelimit-headers-09's, in
// their structured-field form; the item names the rule as
// "<policy>.<rule>".
//
// # Hidden thresholds
//
// A rule's Mode (its responseHeaders) may keep its numbers from its
// answers, so that a threshold, such as a denial-of-service guard's, is
// not advertised to the clients that probe it. ModeFull sends the fields
// above; ModeRetryAfter sends only Retry-After, on a refusal; ModeNone
// sends none. The fields describe the binding rule alone (one item in
// RateLimit-Policy and RateLimit, never a list of every rule that
// matched), so a hidden rule's numbers cannot come out through another
// rule's fields; and the engine makes a hidden rule bind an admitted
// request only when no rule that shows its numbers matched it (see
// engine.Rule.Quiet).
package ratelimitheaders

import (
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Field indexes the fields, in the order they are computed and sent.
type Field int

// The fields.
const (
	XLimit Field = iota
	XRemaining
	XReset
	Policy
	RateLimit
	RetryAfter
	// NumFields is the number of fields.
	NumFields
)

// Names are the fields' names as sent, indexed by Field.
var Names = [NumFields]string{
	XLimit:     "X-RateLimit-Limit",
	XRemaining: "X-RateLimit-Remaining",
	XReset:     "X-RateLimit-Reset",
	Policy:     "RateLimit-Policy",
	RateLimit:  "RateLimit",
	RetryAfter: "Retry-After",
}

// Mode says which fields the answers a rule binds carry. The zero Mode
// is ModeFull.
type Mode uint8

// The modes.
const (
	// ModeFull sends every field.
	ModeFull Mode = iota
	// ModeRetryAfter sends Retry-After on a refusal and nothing else.
	ModeRetryAfter
	// ModeNone sends no field.
	ModeNone
)

// ParseMode returns the Mode of a rule's responseHeaders: "RetryAfter",
// "None", or "Full" and "" (the default) for ModeFull. The sidecar's
// config validation has already refused other values; ParseMode reads
// them as ModeNone, the mode that tells least.
func ParseMode(s string) Mode {
	switch s {
	case "", "Full":
		return ModeFull
	case "RetryAfter":
		return ModeRetryAfter
	}
	return ModeNone
}

// Quiet reports whether m keeps the rule's numbers (its limit, what
// remains, its window) from its answers.
func (m Mode) Quiet() bool { return m != ModeFull }

// String returns the mode as a rule's responseHeaders spells it.
func (m Mode) String() string {
	switch m {
	case ModeFull:
		return "Full"
	case ModeRetryAfter:
		return "RetryAfter"
	}
	return "None"
}

// Binding is what the fields report: the decision on the binding rule.
type Binding struct {
	// Name is the rule's item name, "<policy>.<rule>". Rule and policy
	// names are restricted to [A-Za-z0-9._-], so it quotes without escapes.
	Name string
	// Requests and Period are the rule's limit as written: the q and w of
	// RateLimit-Policy.
	Requests int64
	Period   time.Duration
	// Limit is the capacity of the bucket that decided.
	Limit int64
	// Remaining is what the key may still spend; ignored when Denied.
	Remaining int64
	// ResetAfter is how long until the key is back to full, and RetryAfter
	// how long until the request would be admitted.
	ResetAfter, RetryAfter time.Duration
	// Denied reports that the rule refused the request: a deny, or a
	// fail-closed rule whose store is unreachable.
	Denied bool
	// Mode is the rule's: which of the fields are sent.
	Mode Mode
}

// Bind returns the binding of the rule named name, with limit lim and
// mode m, whose key got decision d; denied reports that the rule refused
// the request.
func Bind(name string, lim limiter.Limit, m Mode, d limiter.Decision, denied bool) Binding {
	return Binding{
		Name: name, Requests: lim.Requests, Period: lim.Period,
		Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter,
		Denied: denied, Mode: m,
	}
}

// Span returns the fields b sends, lo to hi-1: every field but
// Retry-After on an admitted request, all of them on a refusal, for
// ModeFull; Retry-After alone on a refusal for ModeRetryAfter; none
// (lo == hi) otherwise.
func (b *Binding) Span() (lo, hi Field) {
	hi = RetryAfter
	if b.Denied {
		hi = NumFields
	}
	switch b.Mode {
	case ModeFull:
		return 0, hi
	case ModeRetryAfter:
		return RetryAfter, hi
	}
	return hi, hi
}

// RetrySeconds returns the Retry-After value of a denied binding: its
// RetryAfter, or its reset should a deny carry no wait, in whole seconds
// rounded up, at least 1.
func (b *Binding) RetrySeconds() int64 {
	retry := b.RetryAfter
	if retry <= 0 {
		// A deny always names a wait; should one not, the reset is the
		// honest upper bound.
		retry = b.ResetAfter
	}
	return RetrySeconds(retry)
}

// Values holds the fields' values in one string. The zero Values has no
// field.
type Values struct {
	all    string
	ends   [NumFields]int
	lo, hi Field
}

// Span returns the fields sent, lo to hi-1 (see Binding.Span).
func (v *Values) Span() (lo, hi Field) { return v.lo, v.hi }

// Get returns the value of field f, or "" when it is not sent.
func (v *Values) Get(f Field) string {
	if f < v.lo || f >= v.hi {
		return ""
	}
	begin := 0
	if f > v.lo {
		begin = v.ends[f-1]
	}
	return v.all[begin:v.ends[f]]
}

// Format computes the fields of b. It allocates the one string they share.
func Format(b *Binding) Values {
	var buf [192]byte
	out, ends, lo, hi := Append(buf[:0], b)
	return Values{all: string(out), ends: ends, lo: lo, hi: hi}
}

// Append appends the values of the fields b sends (see Binding.Span) to
// dst, one after another, and returns the extended slice, the offset in
// it where each value ends, and the span of the fields sent: field lo
// begins where dst ended, and each later one where the one before it
// ends. Retry-After, when sent, is the last. It is for callers that keep
// more values in the same buffer; Format is the simple form.
func Append(dst []byte, b *Binding) (out []byte, ends [NumFields]int, lo, hi Field) {
	lo, hi = b.Span()
	if lo == hi {
		return dst, ends, lo, hi
	}
	if lo < RetryAfter {
		dst, ends = appendNumbers(dst, b)
	}
	if hi == NumFields {
		dst = strconv.AppendInt(dst, b.RetrySeconds(), 10)
		ends[RetryAfter] = len(dst)
	}
	return dst, ends, lo, hi
}

// appendNumbers appends the values of the fields that state b's numbers:
// every field but Retry-After.
func appendNumbers(dst []byte, b *Binding) ([]byte, [NumFields]int) {
	var ends [NumFields]int
	remaining := b.Remaining
	if b.Denied {
		remaining = 0
	}
	reset := CeilSeconds(max(b.ResetAfter, b.RetryAfter), 0)
	dst = strconv.AppendInt(dst, b.Limit, 10)
	ends[XLimit] = len(dst)
	dst = strconv.AppendInt(dst, remaining, 10)
	ends[XRemaining] = len(dst)
	dst = strconv.AppendInt(dst, reset, 10)
	ends[XReset] = len(dst)
	dst = strconv.AppendQuote(dst, b.Name)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, b.Requests, 10)
	dst = append(dst, ";w="...)
	dst = strconv.AppendInt(dst, int64(b.Period/time.Second), 10)
	ends[Policy] = len(dst)
	dst = strconv.AppendQuote(dst, b.Name)
	dst = append(dst, ";r="...)
	dst = strconv.AppendInt(dst, remaining, 10)
	dst = append(dst, ";t="...)
	dst = strconv.AppendInt(dst, reset, 10)
	ends[RateLimit] = len(dst)
	return dst, ends
}

// CeilSeconds rounds d up to whole seconds, and to at least floor.
func CeilSeconds(d time.Duration, floor int64) int64 {
	return max(int64((d+time.Second-1)/time.Second), floor)
}

// RetrySeconds is the Retry-After value of a wait d: whole seconds rounded
// up, at least 1. Every answer that tells a client to come back later
// (Retry-After, a problem body's retryAfter) uses it.
func RetrySeconds(d time.Duration) int64 { return CeilSeconds(d, 1) }
