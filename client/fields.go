package client

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Fields are the rate-limit fields of one answer, normalised from whichever
// form the server sent.
type Fields struct {
	// Name names the limit the fields describe (floodgate: "policy.rule");
	// empty when the server does not name it.
	Name string
	// Quota is the number of units the limit admits per Window; 0 when
	// unknown.
	Quota int64
	// Window is the limit's period; 0 when unknown.
	Window time.Duration
	// Capacity is the most the limit admits at once (X-RateLimit-Limit:
	// floodgate sends the bucket's capacity there); 0 when unknown, and
	// then Quota stands in.
	Capacity int64
	// Remaining is what the caller may still spend now; -1 when the answer
	// does not say.
	Remaining int64
	// Reset is how long until the limit is back to full; 0 when unknown.
	Reset time.Duration
	// RetryAfter is the Retry-After field as a duration; 0 when absent.
	RetryAfter time.Duration
	// HasRetryAfter reports whether a valid Retry-After was present (it may
	// say 0).
	HasRetryAfter bool
}

// Known reports whether the answer carried a remaining count.
func (f *Fields) Known() bool { return f.Remaining >= 0 }

// ParseFields reads the rate-limit fields of h. now resolves a Retry-After
// given as an HTTP date. It prefers, in order:
//
//   - RateLimit and RateLimit-Policy of draft-ietf-httpapi-ratelimit-headers
//     (structured fields, `"name";r=42;t=18` and `"name";q=100;w=60`); when
//     RateLimit lists several limits, the one with the least remaining;
//   - the earlier drafts' RateLimit-Limit, RateLimit-Remaining and
//     RateLimit-Reset;
//   - X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, whose
//     reset is read as seconds from now unless it is large enough to be a
//     Unix time, as some services send.
//
// Malformed values are ignored, never fatal: a field that cannot be read
// is reported unknown.
func ParseFields(h http.Header, now time.Time) Fields {
	f := Fields{Remaining: -1}
	f.RetryAfter, f.HasRetryAfter = ParseRetryAfter(h.Get("Retry-After"), now)
	if v := h.Values("RateLimit"); len(v) > 0 && parseStructured(&f, strings.Join(v, ", "), strings.Join(h.Values("RateLimit-Policy"), ", ")) {
		f.Capacity = headerInt(h, "X-RateLimit-Limit", 0)
		return f
	}
	for _, prefix := range []string{"RateLimit-", "X-RateLimit-"} {
		rem := headerInt(h, prefix+"Remaining", -1)
		if rem < 0 {
			continue
		}
		f.Remaining = rem
		f.Capacity = headerInt(h, prefix+"Limit", 0)
		f.Quota = f.Capacity
		if reset := headerInt(h, prefix+"Reset", -1); reset >= 0 {
			if reset > 1_000_000_000 {
				// A Unix time (GitHub, for one), not a delta.
				reset = max(0, reset-now.Unix())
			}
			f.Reset = seconds(reset)
		}
		return f
	}
	return f
}

func headerInt(h http.Header, name string, def int64) int64 {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return def
	}
	return n
}

// ParseRetryAfter reads a Retry-After value, delta-seconds or an HTTP date
// (RFC 9110, section 10.2.3), as a duration from now. It reports false for
// an empty or malformed value. A date in the past is 0.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		// Bound the product: a silly value must not overflow.
		return time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, min(t.Sub(now), maxRetryAfter)), true
}

// maxRetryAfter bounds what a Retry-After is read as.
const maxRetryAfter = 24 * time.Hour

// maxSeconds bounds the windows and resets read, so that no product
// overflows.
const maxSeconds = 400 * 24 * 3600

// seconds turns a non-negative count of seconds into a duration, capped at
// maxSeconds.
func seconds(n int64) time.Duration { return time.Duration(min(n, maxSeconds)) * time.Second }

// parseStructured fills f from the RateLimit and RateLimit-Policy field
// values and reports whether RateLimit held a usable item.
func parseStructured(f *Fields, rateLimit, policy string) bool {
	items := parseList(rateLimit)
	best := -1
	for i, it := range items {
		r, ok := it.param("r")
		if !ok || r < 0 {
			continue
		}
		if t, ok := it.param("t"); ok && t < 0 {
			continue
		}
		if best < 0 || r < items[best].int("r") {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	it := items[best]
	f.Name = it.value
	f.Remaining = it.int("r")
	if t, ok := it.param("t"); ok {
		f.Reset = seconds(t)
	}
	for _, p := range parseList(policy) {
		if p.value != f.Name {
			continue
		}
		if q, ok := p.param("q"); ok && q > 0 {
			f.Quota = q
		}
		if w, ok := p.param("w"); ok && w > 0 {
			f.Window = seconds(w)
		}
		break
	}
	return true
}

// item is one member of a structured-field list (RFC 9651): a string or
// token value and its integer parameters (others are skipped).
type item struct {
	value  string
	params map[string]int64
}

func (it item) param(k string) (int64, bool) {
	v, ok := it.params[k]
	return v, ok
}

func (it item) int(k string) int64 { return it.params[k] }

// parseList parses a structured-field list of items leniently: a member
// that does not parse is skipped up to the next comma.
func parseList(s string) []item {
	var out []item
	p := sfParser{s: s}
	for {
		p.skipSpace()
		if p.done() {
			return out
		}
		it, ok := p.item()
		if ok {
			out = append(out, it)
		}
		p.skipTo(',')
		if p.done() {
			return out
		}
		p.i++ // the comma
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skipSpace() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// skipTo moves to the next unquoted c, or the end.
func (p *sfParser) skipTo(c byte) {
	quoted := false
	for ; !p.done(); p.i++ {
		switch b := p.s[p.i]; {
		case quoted && b == '\\':
			p.i++
		case b == '"':
			quoted = !quoted
		case !quoted && b == c:
			return
		}
	}
}

func (p *sfParser) item() (item, bool) {
	it := item{params: map[string]int64{}}
	v, ok := p.bare()
	if !ok {
		return it, false
	}
	it.value = v
	for {
		p.skipSpace()
		if p.done() || p.s[p.i] != ';' {
			return it, true
		}
		p.i++
		p.skipSpace()
		k := p.key()
		if k == "" {
			return it, false
		}
		if p.done() || p.s[p.i] != '=' {
			continue // a boolean true parameter
		}
		p.i++
		start := p.i
		if v, ok := p.bare(); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && p.s[start] != '"' {
				it.params[k] = n
			}
		}
	}
}

// bare reads a string, token or number.
func (p *sfParser) bare() (string, bool) {
	if p.done() {
		return "", false
	}
	if p.s[p.i] == '"' {
		var b strings.Builder
		for p.i++; !p.done(); p.i++ {
			switch c := p.s[p.i]; c {
			case '\\':
				p.i++
				if p.done() {
					return "", false
				}
				b.WriteByte(p.s[p.i])
			case '"':
				p.i++
				return b.String(), true
			default:
				b.WriteByte(c)
			}
		}
		return "", false
	}
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		if c == ';' || c == ',' || c == ' ' || c == '\t' || c == '=' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], p.i > start
}

// key reads a parameter key: lowercase letters, digits, _ - . *.
func (p *sfParser) key() string {
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		lower := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !lower && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i]
}
