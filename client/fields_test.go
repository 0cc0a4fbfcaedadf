package client

import (
	"net/http"
	"testing"
	"time"
)

func TestParseFields(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string][]string
		want   Fields
	}{{
		name: "floodgate's answer",
		header: map[string][]string{
			"Ratelimit":             {`"checkout.per-user";r=42;t=18`},
			"Ratelimit-Policy":      {`"checkout.per-user";q=100;w=60`},
			"X-Ratelimit-Limit":     {"50"},
			"X-Ratelimit-Remaining": {"42"},
			"X-Ratelimit-Reset":     {"18"},
		},
		want: Fields{Name: "checkout.per-user", Quota: 100, Window: time.Minute, Capacity: 50, Remaining: 42, Reset: 18 * time.Second},
	}, {
		name: "a deny",
		header: map[string][]string{
			"Ratelimit":        {`"checkout.per-user";r=0;t=2`},
			"Ratelimit-Policy": {`"checkout.per-user";q=5;w=10`},
			"Retry-After":      {"2"},
		},
		want: Fields{Name: "checkout.per-user", Quota: 5, Window: 10 * time.Second, Remaining: 0, Reset: 2 * time.Second,
			RetryAfter: 2 * time.Second, HasRetryAfter: true},
	}, {
		name: "several limits: the one with least remaining, its own policy",
		header: map[string][]string{
			"Ratelimit":        {`"day";r=900;t=3600, "burst";r=3;t=1`},
			"Ratelimit-Policy": {`"day";q=1000;w=86400`, `"burst";q=10;w=1`},
		},
		want: Fields{Name: "burst", Quota: 10, Window: time.Second, Remaining: 3, Reset: time.Second},
	}, {
		name: "tokens, unknown and boolean parameters, escapes",
		header: map[string][]string{
			"Ratelimit":        {`default;r=7;t=3;extra="x;y";flag, "a\"b";r=9`},
			"Ratelimit-Policy": {`default;q=10;w=5;pk=:YWJj:`},
		},
		want: Fields{Name: "default", Quota: 10, Window: 5 * time.Second, Remaining: 7, Reset: 3 * time.Second},
	}, {
		name:   "an unterminated string swallows the rest",
		header: map[string][]string{"Ratelimit": {`"unterminated;r=1, ok;r=4;t=1`}},
		want:   Fields{Remaining: -1},
	}, {
		name:   "a member that does not parse is skipped",
		header: map[string][]string{"Ratelimit": {`=x;r=1, "ok";r=-2, "good";r=4;t=1`}},
		want:   Fields{Name: "good", Remaining: 4, Reset: time.Second},
	}, {
		name:   "a RateLimit without r falls back to X-RateLimit",
		header: map[string][]string{"Ratelimit": {`"p";t=4`}, "X-Ratelimit-Remaining": {"3"}, "X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Reset": {"4"}},
		want:   Fields{Capacity: 10, Quota: 10, Remaining: 3, Reset: 4 * time.Second},
	}, {
		name:   "the earlier drafts' fields",
		header: map[string][]string{"Ratelimit-Limit": {"60"}, "Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"30"}},
		want:   Fields{Capacity: 60, Quota: 60, Remaining: 0, Reset: 30 * time.Second},
	}, {
		name:   "X-RateLimit-Reset as a Unix time",
		header: map[string][]string{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1772366445"}},
		want:   Fields{Remaining: 1, Reset: 45 * time.Second},
	}, {
		name:   "Retry-After as an HTTP date",
		header: map[string][]string{"Retry-After": {"Sun, 01 Mar 2026 12:00:30 GMT"}},
		want:   Fields{Remaining: -1, RetryAfter: 30 * time.Second, HasRetryAfter: true},
	}, {
		name:   "Retry-After in the past",
		header: map[string][]string{"Retry-After": {"Sun, 01 Mar 2026 11:00:00 GMT"}},
		want:   Fields{Remaining: -1, HasRetryAfter: true},
	}, {
		name:   "garbage everywhere",
		header: map[string][]string{"Retry-After": {"soon"}, "X-Ratelimit-Remaining": {"-3"}, "Ratelimit": {";;;,,,"}},
		want:   Fields{Remaining: -1},
	}, {
		name:   "nothing",
		header: map[string][]string{},
		want:   Fields{Remaining: -1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ParseFields(http.Header(tt.header), now); got != tt.want {
				t.Errorf("ParseFields = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true}, {"1", time.Second, true}, {" 120 ", 2 * time.Minute, true},
		{"99999999999999", 24 * time.Hour, true}, {"-1", 0, false}, {"1.5", 0, false}, {"", 0, false},
		{"Sun, 01 Mar 2026 12:01:00 GMT", time.Minute, true}, {"Sunday, 01-Mar-26 12:01:00 GMT", time.Minute, true},
	} {
		got, ok := ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseFields(f *testing.F) {
	f.Add(`"a";r=1;t=2`, `"a";q=3;w=4`, "5", "6")
	f.Add(`"\`, `;`, "", "Sun, 01 Mar 2026 12:00:30 GMT")
	f.Add(`a;r=1;t=99999999999999999`, `a;q=-1;w=99999999999999999`, "99999999999999999", "1")
	f.Fuzz(func(t *testing.T, rl, pol, remaining, retry string) {
		h := http.Header{"Ratelimit": {rl}, "Ratelimit-Policy": {pol}, "X-Ratelimit-Remaining": {remaining},
			"X-Ratelimit-Reset": {remaining}, "Retry-After": {retry}}
		got := ParseFields(h, time.Unix(0, 0))
		if got.Remaining < -1 || got.Quota < 0 || got.Window < 0 || got.Reset < 0 || got.Capacity < 0 ||
			got.RetryAfter < 0 || got.RetryAfter > maxRetryAfter {
			t.Errorf("ParseFields(%q) = %+v: out of range", h, got)
		}
	})
}
