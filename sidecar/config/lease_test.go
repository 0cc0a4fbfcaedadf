package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// TestLeaseAndSplitValidated: lease takes Auto or Off, split a count the
// limit can be divided into, a cost must fit one sub-counter, and an
// unlimited or zero descriptor rule takes neither; every error names its
// field.
func TestLeaseAndSplitValidated(t *testing.T) {
	t.Parallel()
	per := metav1.Duration{Duration: time.Second}
	rule := func(l Limit, c Cost) Rule { return Rule{Name: "r", Limit: l, Cost: c} }
	desc := func(l Limit) Rule {
		return Rule{Name: "d", Limit: l, Match: Match{Descriptors: &DescriptorMatch{Domain: "x", Entries: []DescriptorEntry{{Key: "k"}}}}}
	}
	for _, tc := range []struct {
		r    Rule
		want []string // field paths, in order; none for a valid rule
	}{
		{rule(Limit{Requests: 10, Per: per, Lease: LeaseOff}, Cost{}), nil},
		{rule(Limit{Requests: 10, Per: per, Lease: LeaseAuto, Split: 3}, Cost{Default: 3}), nil},
		{rule(Limit{Requests: 10, Per: per, Lease: "on"}, Cost{}), []string{"limit.lease"}},
		{rule(Limit{Requests: 10, Per: per, Lease: "false"}, Cost{}), []string{"limit.lease"}},
		{rule(Limit{Requests: 10, Per: per, Split: 17}, Cost{}), []string{"limit.split"}},
		{rule(Limit{Requests: 10, Per: per, Split: -1}, Cost{}), []string{"limit.split"}},
		{rule(Limit{Requests: 2, Per: per, Split: 3}, Cost{}), []string{"limit.split"}},
		{rule(Limit{Requests: 100, Per: per, Burst: 2, Split: 3}, Cost{}), []string{"limit.split"}},
		{rule(Limit{Requests: 10, Per: per, Split: 3}, Cost{Default: 4}), []string{"cost.default"}},
		{rule(Limit{Requests: 10, Per: per, Split: 3}, Cost{FromHeader: "X-Cost", Max: 4}), []string{"cost.max"}},
		{desc(Limit{Requests: 10, Per: per, Split: 2, Lease: LeaseOff}), nil},
		{desc(Limit{Requests: 10, Per: per, Lease: "Always"}), []string{"limit.lease"}},
		{desc(Limit{Unlimited: true, Lease: LeaseOff}), []string{"limit"}},
		{desc(Limit{Requests: 0, Per: per, Split: 2}), []string{"limit.split"}},
	} {
		c := &Config{APIVersion: APIVersion, Policies: []Policy{{Name: "p", UID: "u", Rules: []Rule{tc.r}}}}
		err := c.Validate()
		var paths []string
		if err != nil {
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("%+v: error %v is not a FieldError", tc.r.Limit, e)
				}
				paths = append(paths, strings.TrimPrefix(fe.Path, "policies[0].rules[0]."))
			}
		}
		if strings.Join(paths, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%+v cost %+v: errors on %v, want %v (%v)", tc.r.Limit, tc.r.Cost, paths, tc.want, err)
		}
	}
}

// TestBareOffIsExplained: a policy file that writes lease: Off without
// quotes (YAML's boolean false) gets an error that says how to write it.
func TestBareOffIsExplained(t *testing.T) {
	t.Parallel()
	doc := "apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: u\n  rules:\n  - name: r\n    key: []\n    limit: {requests: 5, per: 1s, lease: Off}\n"
	_, err := Load([]byte(doc))
	if err == nil || !strings.Contains(err.Error(), "policies[0].rules[0].limit.lease") || !strings.Contains(err.Error(), `lease: "Off"`) {
		t.Fatalf("Load(lease: Off) = %v, want an error on limit.lease saying to quote Off", err)
	}
	quoted := strings.Replace(doc, "lease: Off", `lease: "Off"`, 1)
	c, err := Load([]byte(quoted))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Policies[0].Rules[0].Limit.Lease; got != LeaseOff {
		t.Fatalf("lease = %q, want Off", got)
	}
}

// TestLeasesAndParts: what the engine reads from a limit.
func TestLeasesAndParts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		l      Limit
		alg    limiter.Algorithm
		leases bool
		parts  int
	}{
		{Limit{}, limiter.TokenBucket, true, 1},
		{Limit{Lease: LeaseAuto, Split: 1}, limiter.SlidingWindow, true, 1},
		{Limit{Lease: LeaseOff, Split: 4}, limiter.GCRA, false, 4},
		{Limit{}, limiter.SlidingLog, false, 1},
	} {
		if got := tc.l.Leases(tc.alg); got != tc.leases {
			t.Errorf("%+v.Leases(%v) = %v, want %v", tc.l, tc.alg, got, tc.leases)
		}
		if got := tc.l.Parts(); got != tc.parts {
			t.Errorf("%+v.Parts() = %d, want %d", tc.l, got, tc.parts)
		}
	}
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 50}
	if got := (Limit{Split: 3}).PartCapacity(lim); got != 16 {
		t.Errorf("PartCapacity of burst 50 split 3 = %d, want 16", got)
	}
}
