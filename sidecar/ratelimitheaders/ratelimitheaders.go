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
}

// Bind returns the binding of the rule named name, with limit lim, whose
// key got decision d; denied reports that the rule refused the request.
func Bind(name string, lim limiter.Limit, d limiter.Decision, denied bool) Binding {
	return Binding{
		Name: name, Requests: lim.Requests, Period: lim.Period,
		Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter,
		Denied: denied,
	}
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
	all  string
	ends [NumFields]int
	n    int
}

// Len returns the number of fields: NumFields on a deny, NumFields-1
// (no Retry-After) otherwise.
func (v *Values) Len() int { return v.n }

// Get returns the value of field f, or "" when it is not sent.
func (v *Values) Get(f Field) string {
	if int(f) >= v.n {
		return ""
	}
	begin := 0
	if f > 0 {
		begin = v.ends[f-1]
	}
	return v.all[begin:v.ends[f]]
}

// Format computes the fields of b. It allocates the one string they share.
func Format(b *Binding) Values {
	var buf [192]byte
	out, ends, n := Append(buf[:0], b)
	return Values{all: string(out), ends: ends, n: n}
}

// Append appends the values of the fields of b to dst, one after another,
// and returns the extended slice, the offset in it where each value ends,
// and how many fields there are (Retry-After is the last, and only sent on
// a deny). It is for callers that keep more values in the same buffer;
// Format is the simple form.
func Append(dst []byte, b *Binding) (out []byte, ends [NumFields]int, n int) {
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
	if !b.Denied {
		return dst, ends, int(RetryAfter)
	}
	dst = strconv.AppendInt(dst, b.RetrySeconds(), 10)
	ends[RetryAfter] = len(dst)
	return dst, ends, int(NumFields)
}

// CeilSeconds rounds d up to whole seconds, and to at least floor.
func CeilSeconds(d time.Duration, floor int64) int64 {
	return max(int64((d+time.Second-1)/time.Second), floor)
}

// RetrySeconds is the Retry-After value of a wait d: whole seconds rounded
// up, at least 1. Every answer that tells a client to come back later
// (Retry-After, a problem body's retryAfter) uses it.
func RetrySeconds(d time.Duration) int64 { return CeilSeconds(d, 1) }
