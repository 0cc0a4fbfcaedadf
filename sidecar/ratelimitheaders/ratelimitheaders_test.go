package ratelimitheaders

import (
	"fmt"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

func TestFormat(t *testing.T) {
	t.Parallel()
	base := Binding{Name: "shop.per-user", Requests: 2, Period: time.Minute, Limit: 4}
	with := func(f func(b *Binding)) Binding {
		b := base
		f(&b)
		return b
	}
	for _, tc := range []struct {
		name string
		b    Binding
		want [NumFields]string
	}{
		{"allowed, a fraction of a second rounds up",
			with(func(b *Binding) { b.Remaining, b.ResetAfter = 3, 29*time.Second+time.Microsecond }),
			[NumFields]string{"4", "3", "30", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=3;t=30`, ""}},
		{"allowed, whole seconds stay",
			with(func(b *Binding) { b.Remaining, b.ResetAfter = 3, 30*time.Second }),
			[NumFields]string{"4", "3", "30", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=3;t=30`, ""}},
		{"allowed at full",
			with(func(b *Binding) { b.Remaining = 4 }),
			[NumFields]string{"4", "4", "0", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=4;t=0`, ""}},
		{"denied: nothing remains, Retry-After rounds up",
			with(func(b *Binding) {
				b.Remaining, b.ResetAfter, b.RetryAfter, b.Denied = 2, 60*time.Second, 29500*time.Millisecond, true
			}),
			[NumFields]string{"4", "0", "60", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=0;t=60`, "30"}},
		{"denied: the reset is never before the retry",
			with(func(b *Binding) { b.ResetAfter, b.RetryAfter, b.Denied = 10*time.Second, 20*time.Second, true }),
			[NumFields]string{"4", "0", "20", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=0;t=20`, "20"}},
		{"denied: a wait under a second is 1",
			with(func(b *Binding) { b.RetryAfter, b.Denied = time.Microsecond, true }),
			[NumFields]string{"4", "0", "1", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=0;t=1`, "1"}},
		{"denied without a wait: the reset, at least 1",
			with(func(b *Binding) { b.ResetAfter, b.Denied = 2500*time.Millisecond, true }),
			[NumFields]string{"4", "0", "3", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=0;t=3`, "3"}},
		{"denied with neither",
			with(func(b *Binding) { b.Denied = true }),
			[NumFields]string{"4", "0", "0", `"shop.per-user";q=2;w=60`, `"shop.per-user";r=0;t=0`, "1"}},
		{"a rule that denies every call",
			Binding{Name: "edge.block", Period: time.Hour, ResetAfter: 90 * time.Second, RetryAfter: 90 * time.Second, Denied: true},
			[NumFields]string{"0", "0", "90", `"edge.block";q=0;w=3600`, `"edge.block";r=0;t=90`, "90"}},
		{"largest values",
			Binding{Name: "p.r", Requests: limiter.MaxRequests, Period: limiter.MaxPeriod, Limit: limiter.MaxRequests,
				Remaining: limiter.MaxRequests - 1, ResetAfter: limiter.MaxFillTime},
			[NumFields]string{"1000000000", "999999999", "3162240000", `"p.r";q=1000000000;w=31622400`,
				`"p.r";r=999999999;t=3162240000`, ""}},
	} {
		v := Format(&tc.b)
		wantHi := NumFields
		if !tc.b.Denied {
			wantHi--
		}
		if lo, hi := v.Span(); lo != 0 || hi != wantHi {
			t.Errorf("%s: Span() = %d, %d, want 0, %d", tc.name, lo, hi, wantHi)
		}
		for f := range NumFields {
			if got, want := v.Get(f), tc.want[f]; got != want {
				t.Errorf("%s: %s = %q, want %q", tc.name, Names[f], got, want)
			}
		}
	}
}

// Append's offsets index the slice it returns, whatever it held before.
func TestAppendAfterOtherValues(t *testing.T) {
	t.Parallel()
	b := Binding{Name: "p.r", Requests: 10, Period: time.Second, Limit: 10, Remaining: 0,
		ResetAfter: time.Second, RetryAfter: 100 * time.Millisecond, Denied: true}
	out, ends, lo, hi := Append([]byte("prefix"), &b)
	if lo != 0 || hi != NumFields {
		t.Fatalf("span = %d, %d, want 0, %d", lo, hi, NumFields)
	}
	begin := len("prefix")
	want := [NumFields]string{"10", "0", "1", `"p.r";q=10;w=1`, `"p.r";r=0;t=1`, "1"}
	for f := range NumFields {
		if got := string(out[begin:ends[f]]); got != want[f] {
			t.Errorf("%s = %q, want %q", Names[f], got, want[f])
		}
		begin = ends[f]
	}
	if got, want := string(out[:len("prefix")]), "prefix"; got != want {
		t.Errorf("the slice starts %q, want %q", got, want)
	}
}

// Bind copies the decision and the limit as written, not the limit's
// capacity: X-RateLimit-Limit is the bucket that decided.
func TestBind(t *testing.T) {
	t.Parallel()
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Minute, Burst: 20}
	d := limiter.Decision{Limit: 10, Remaining: 3, ResetAfter: time.Second, RetryAfter: 2 * time.Second}
	got := Bind("p.r", lim, ModeRetryAfter, d, true)
	want := Binding{Name: "p.r", Requests: 100, Period: time.Minute, Limit: 10, Remaining: 3,
		ResetAfter: time.Second, RetryAfter: 2 * time.Second, Denied: true, Mode: ModeRetryAfter}
	if got != want {
		t.Errorf("Bind() = %+v, want %+v", got, want)
	}
}

// A rule's mode decides which fields are sent: RetryAfter keeps only
// Retry-After, on a refusal; None keeps nothing; a prefix in dst stays.
func TestModes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   Mode
		denied bool
		want   map[Field]string
	}{
		{ModeFull, false, map[Field]string{XLimit: "10", XRemaining: "4", XReset: "6", Policy: `"p.r";q=10;w=60`, RateLimit: `"p.r";r=4;t=6`}},
		{ModeFull, true, map[Field]string{XLimit: "10", XRemaining: "0", XReset: "6", Policy: `"p.r";q=10;w=60`, RateLimit: `"p.r";r=0;t=6`, RetryAfter: "2"}},
		{ModeRetryAfter, false, map[Field]string{}},
		{ModeRetryAfter, true, map[Field]string{RetryAfter: "2"}},
		{ModeNone, false, map[Field]string{}},
		{ModeNone, true, map[Field]string{}},
	} {
		b := Binding{Name: "p.r", Requests: 10, Period: time.Minute, Limit: 10, Remaining: 4,
			ResetAfter: 6 * time.Second, RetryAfter: 1500 * time.Millisecond, Denied: tc.denied, Mode: tc.mode}
		v := Format(&b)
		lo, hi := v.Span()
		if got, want := int(hi-lo), len(tc.want); got != want {
			t.Errorf("%v, denied %v: %d fields, want %d", tc.mode, tc.denied, got, want)
		}
		for f := range NumFields {
			if got, want := v.Get(f), tc.want[f]; got != want {
				t.Errorf("%v, denied %v: %s = %q, want %q", tc.mode, tc.denied, Names[f], got, want)
			}
		}
		out, ends, lo, hi := Append([]byte("prefix"), &b)
		begin := len("prefix")
		for f := lo; f < hi; f++ {
			if got, want := string(out[begin:ends[f]]), tc.want[f]; got != want {
				t.Errorf("%v, denied %v: Append: %s = %q, want %q", tc.mode, tc.denied, Names[f], got, want)
			}
			begin = ends[f]
		}
		if got, want := len(out), begin; got != want {
			t.Errorf("%v, denied %v: Append wrote %d bytes past its fields", tc.mode, tc.denied, got-want)
		}
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Mode{"": ModeFull, "Full": ModeFull, "RetryAfter": ModeRetryAfter, "None": ModeNone, "bogus": ModeNone} {
		if got := ParseMode(in); got != want {
			t.Errorf("ParseMode(%q) = %v, want %v", in, got, want)
		}
	}
	if ModeFull.Quiet() || !ModeRetryAfter.Quiet() || !ModeNone.Quiet() {
		t.Error("Quiet: only Full shows the numbers")
	}
}

// A gRPC refusal by a None rule carries no rate-limit field and no
// pushback; by a RetryAfter rule, both.
func TestGRPCRefusalModes(t *testing.T) {
	t.Parallel()
	b := Binding{Name: "p.r", Requests: 10, Period: time.Minute, Limit: 10, RetryAfter: 2 * time.Second, Denied: true}
	for mode, want := range map[Mode][]string{
		ModeNone:       {"grpc-status", "8", "grpc-message", "rate limit exceeded"},
		ModeRetryAfter: {"grpc-status", "8", "grpc-message", "rate limit exceeded", "grpc-retry-pushback-ms", "2000", "retry-after", "2"},
	} {
		b.Mode = mode
		got := GRPCRefusal(nil, &b, GRPCResourceExhausted, "rate limit exceeded", 2*time.Second)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%v: GRPCRefusal() = %q, want %q", mode, got, want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d           time.Duration
		floor, want int64
	}{
		{0, 0, 0},
		{0, 1, 1},
		{-time.Second, 0, 0},
		{time.Nanosecond, 0, 1},
		{time.Second, 0, 1},
		{time.Second + time.Nanosecond, 0, 2},
		{59*time.Second + 999*time.Millisecond, 1, 60},
	} {
		if got := CeilSeconds(tc.d, tc.floor); got != tc.want {
			t.Errorf("CeilSeconds(%v, %d) = %d, want %d", tc.d, tc.floor, got, tc.want)
		}
	}
	if got, want := RetrySeconds(0), int64(1); got != want {
		t.Errorf("RetrySeconds(0) = %d, want %d", got, want)
	}
}

func BenchmarkFormat(b *testing.B) {
	bd := Binding{Name: "checkout.per-user", Requests: 100, Period: time.Minute, Limit: 100,
		ResetAfter: 18 * time.Second, RetryAfter: 600 * time.Millisecond, Denied: true}
	b.ReportAllocs()
	for b.Loop() {
		v := Format(&bd)
		if _, hi := v.Span(); hi != NumFields {
			b.Fatal(hi)
		}
	}
}
