package config

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// delayLimit is 100 per second that delays up to 2s.
func delayLimit() Limit {
	return Limit{Requests: 100, Per: metav1.Duration{Duration: time.Second}, OnExceed: OnExceedDelay,
		MaxDelay: metav1.Duration{Duration: 2 * time.Second}}
}

// TestDelayLimiter: a Delay limit is a GCRA limit whose capacity is
// delayAfter (1 when unset) and whose MaxDelay is maxDelay, whatever
// algorithm of the two it names; a Deny limit carries no MaxDelay.
func TestDelayLimiter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		l    func(l *Limit)
		want limiter.Limit
	}{
		{"delayAfter unset", func(*Limit) {},
			limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}},
		{"delayAfter 20", func(l *Limit) { l.DelayAfter = 20 },
			limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Second, Burst: 20, MaxDelay: 2 * time.Second}},
		{"TokenBucket, as the API defaults it", func(l *Limit) { l.Algorithm = "TokenBucket" },
			limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}},
		{"GCRA, lease Off, split 1", func(l *Limit) { l.Algorithm, l.Lease, l.Split = "GCRA", LeaseOff, 1 },
			limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}},
		{"maxDelay at its bounds", func(l *Limit) { l.MaxDelay.Duration = time.Minute },
			limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Second, Burst: 1, MaxDelay: time.Minute}},
		{"Deny", func(l *Limit) { l.OnExceed, l.MaxDelay.Duration, l.Burst = OnExceedDeny, 0, 7 },
			limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 7}},
	} {
		l := delayLimit()
		tc.l(&l)
		got, err := l.Limiter()
		if err != nil {
			t.Errorf("%s: %+v.Limiter() error: %v", tc.name, l, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: %+v.Limiter() = %+v, want %+v", tc.name, l, got, tc.want)
		}
	}
}

// TestDelayCheck: the Delay fields are checked as the limit's own, each
// problem on its field, once.
func TestDelayCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		l     func(l *Limit)
		paths []string
	}{
		{"unknown onExceed", func(l *Limit) { l.OnExceed, l.MaxDelay.Duration = "Queue", 0 }, []string{"onExceed"}},
		{"maxDelay without Delay", func(l *Limit) { l.OnExceed = "" }, []string{"maxDelay"}},
		{"delayAfter with Deny", func(l *Limit) { l.OnExceed, l.MaxDelay.Duration, l.DelayAfter = OnExceedDeny, 0, 5 }, []string{"delayAfter"}},
		{"maxDelay missing", func(l *Limit) { l.MaxDelay.Duration = 0 }, []string{"maxDelay"}},
		{"maxDelay under 1ms", func(l *Limit) { l.MaxDelay.Duration = 999 * time.Microsecond }, []string{"maxDelay"}},
		{"maxDelay over 1m", func(l *Limit) { l.MaxDelay.Duration = time.Minute + time.Microsecond }, []string{"maxDelay"}},
		{"maxDelay negative", func(l *Limit) { l.MaxDelay.Duration = -time.Second }, []string{"maxDelay"}},
		{"maxDelay not whole microseconds", func(l *Limit) { l.MaxDelay.Duration = time.Second + time.Nanosecond }, []string{"maxDelay"}},
		{"delayAfter negative", func(l *Limit) { l.DelayAfter = -1 }, []string{"delayAfter"}},
		{"delayAfter over the bound", func(l *Limit) { l.DelayAfter = limiter.MaxRequests + 1 }, []string{"delayAfter"}},
		{"delayAfter too slow to refill", func(l *Limit) { l.Requests, l.Per.Duration, l.DelayAfter = 1, 8784*time.Hour, 1000 }, []string{"delayAfter"}},
		{"burst", func(l *Limit) { l.Burst = 10 }, []string{"burst"}},
		{"SlidingWindow", func(l *Limit) { l.Algorithm = "SlidingWindow" }, []string{"algorithm"}},
		{"unknown algorithm, once", func(l *Limit) { l.Algorithm = "Leaky" }, []string{"algorithm"}},
		{"all at once", func(l *Limit) { l.Requests, l.Burst, l.MaxDelay.Duration = 0, 3, 0 }, []string{"maxDelay", "burst", "requests"}},
	} {
		l := delayLimit()
		tc.l(&l)
		_, problems := l.Check()
		var paths []string
		for _, p := range problems {
			paths = append(paths, p.Path)
			if p.Msg == "" || strings.HasPrefix(p.Msg, p.Path+":") {
				t.Errorf("%s: problem %+v: the message must be the reason alone", tc.name, p)
			}
		}
		if got, want := strings.Join(paths, ","), strings.Join(tc.paths, ","); got != want {
			t.Errorf("%s: %+v.Check() problems on %v, want %v (%v)", tc.name, l, got, want, problems)
		}
	}
}

// TestDelayRuleValidated: in a document, a Delay limit refuses lease Auto,
// a split, Shadow mode, a cost above delayAfter and a descriptor rule,
// each on its field.
func TestDelayRuleValidated(t *testing.T) {
	t.Parallel()
	rule := func(mutate func(r *Rule)) Rule {
		r := Rule{Name: "r", Limit: delayLimit()}
		mutate(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		r    Rule
		want []string // field paths under the rule, in order
	}{
		{"valid", rule(func(*Rule) {}), nil},
		{"lease Off, split 1, cost within delayAfter", rule(func(r *Rule) {
			r.Limit.Lease, r.Limit.Split, r.Limit.DelayAfter, r.Cost = LeaseOff, 1, 5, Cost{Default: 5}
		}), nil},
		{"lease Auto", rule(func(r *Rule) { r.Limit.Lease = LeaseAuto }), []string{"limit.lease"}},
		{"split 2", rule(func(r *Rule) { r.Limit.Split = 2 }), []string{"limit.split"}},
		{"Shadow", rule(func(r *Rule) { r.Mode = ModeShadow }), []string{"mode"}},
		{"cost above delayAfter", rule(func(r *Rule) { r.Limit.DelayAfter, r.Cost = 2, Cost{Default: 3} }), []string{"cost.default"}},
		{"cost.max above delayAfter", rule(func(r *Rule) { r.Cost = Cost{FromHeader: "X-Cost", Max: 2} }), []string{"cost.max"}},
		{"maxDelay without Delay", rule(func(r *Rule) { r.Limit.OnExceed = "" }), []string{"limit.maxDelay"}},
		{"descriptor rule", rule(func(r *Rule) {
			r.Match.Descriptors = &DescriptorMatch{Domain: "d", Entries: []DescriptorEntry{{Key: "k"}}}
		}), []string{"limit.onExceed"}},
		{"unlimited descriptor rule with maxDelay", rule(func(r *Rule) {
			r.Match.Descriptors = &DescriptorMatch{Domain: "d", Entries: []DescriptorEntry{{Key: "k"}}}
			r.Limit = Limit{Unlimited: true, MaxDelay: metav1.Duration{Duration: time.Second}}
		}), []string{"limit"}},
	} {
		c := &Config{APIVersion: APIVersion, Policies: []Policy{{Name: "p", UID: "u", Rules: []Rule{tc.r}}}}
		err := c.Validate()
		var paths []string
		if err != nil {
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("%s: error %v is not a FieldError", tc.name, e)
				}
				paths = append(paths, strings.TrimPrefix(fe.Path, "policies[0].rules[0]."))
			}
		}
		if got, want := strings.Join(paths, ","), strings.Join(tc.want, ","); got != want {
			t.Errorf("%s: errors on %v, want %v (%v)", tc.name, got, want, err)
		}
	}
}

// TestDelayNeverLeasesOrSplits: what the engine reads from a Delay limit.
func TestDelayNeverLeasesOrSplits(t *testing.T) {
	t.Parallel()
	l := delayLimit()
	l.Split = 4 // refused by validation; the engine still reads one part
	if l.Leases(limiter.GCRA) {
		t.Errorf("%+v.Leases(GCRA) = true, want false", l)
	}
	if got, want := l.Parts(), 1; got != want {
		t.Errorf("%+v.Parts() = %d, want %d", l, got, want)
	}
}

// TestDelayFieldsRoundTrip: the fields are read from a policy file by
// their JSON names, and a Deny limit writes none of them.
func TestDelayFieldsRoundTrip(t *testing.T) {
	t.Parallel()
	doc := "apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: u\n  rules:\n  - name: r\n    key: []\n" +
		"    limit: {requests: 100, per: 1s, onExceed: Delay, maxDelay: 2s, delayAfter: 20}\n"
	c, err := Load([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Policies[0].Rules[0].Limit
	if l.OnExceed != OnExceedDelay || l.MaxDelay.Duration != 2*time.Second || l.DelayAfter != 20 {
		t.Errorf("read %+v, want onExceed Delay, maxDelay 2s, delayAfter 20", l)
	}
	out, err := json.Marshal(&Config{APIVersion: APIVersion, Policies: []Policy{{Name: "p", UID: "u",
		Rules: []Rule{{Name: "r", Limit: Limit{Requests: 1, Per: metav1.Duration{Duration: time.Second}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"onExceed", "maxDelay", "delayAfter"} {
		if strings.Contains(string(out), name) {
			t.Errorf("a Deny limit writes %s: %s", name, out)
		}
	}
}
