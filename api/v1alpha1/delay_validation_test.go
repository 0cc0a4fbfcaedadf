package v1alpha1

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// delayPolicy has one rule, 100 per second, that delays up to 2s.
func delayPolicy() *RateLimitPolicy {
	return &RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "smooth", Namespace: "ns"},
		Spec: RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "payments"}},
			Rules: []Rule{{
				Name: "provider",
				Key:  []KeyPart{{Header: "X-Merchant"}},
				Limit: Limit{Requests: 100, Per: metav1.Duration{Duration: time.Second}, OnExceed: OnExceedDelay,
					MaxDelay: metav1.Duration{Duration: 2 * time.Second}},
			}},
		},
	}
}

func TestValidateSemanticsAcceptsDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(l *Limit, r *Rule)
	}{
		{"delayAfter unset", func(*Limit, *Rule) {}},
		{"delayAfter, TokenBucket as the API defaults it", func(l *Limit, _ *Rule) { l.DelayAfter, l.Algorithm = 20, AlgorithmTokenBucket }},
		{"GCRA, lease Off, split 1", func(l *Limit, _ *Rule) { l.Algorithm, l.Lease, l.Split = AlgorithmGCRA, LeaseOff, 1 }},
		{"the bounds", func(l *Limit, _ *Rule) { l.MaxDelay.Duration, l.DelayAfter = time.Minute, 1_000_000_000 }},
		{"1ms", func(l *Limit, _ *Rule) { l.MaxDelay.Duration = time.Millisecond }},
		{"a cost within delayAfter, in Enforce mode", func(l *Limit, r *Rule) {
			l.DelayAfter = 5
			r.Cost, r.Mode = &Cost{FromHeader: "X-Cost", Default: 2, Max: 5}, ModeEnforce
		}},
		{"Deny written out", func(l *Limit, _ *Rule) { l.OnExceed, l.MaxDelay.Duration, l.Burst = OnExceedDeny, 0, 50 }},
	} {
		p := delayPolicy()
		r := &p.Spec.Rules[0]
		tc.mutate(&r.Limit, r)
		if errs := p.ValidateSemantics(); len(errs) != 0 {
			t.Errorf("%s: ValidateSemantics() = %v, want no errors", tc.name, errs.ToAggregate())
		}
	}
}

// TestValidateSemanticsRejectsDelay: each refusal names its field, as the
// CRD's CEL rule does (test/policycases).
func TestValidateSemanticsRejectsDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(p *RateLimitPolicy, l *Limit)
		field  string
		detail string
	}{
		{"unknown onExceed", func(_ *RateLimitPolicy, l *Limit) { l.OnExceed = "Queue" },
			"spec.rules[0].limit.onExceed", "Unsupported value"},
		{"maxDelay missing", func(_ *RateLimitPolicy, l *Limit) { l.MaxDelay.Duration = 0 },
			"spec.rules[0].limit.maxDelay", "required with onExceed: Delay"},
		{"maxDelay under 1ms", func(_ *RateLimitPolicy, l *Limit) { l.MaxDelay.Duration = 500 * time.Microsecond },
			"spec.rules[0].limit.maxDelay", "must be between 1ms and 1m0s"},
		{"maxDelay over 1m", func(_ *RateLimitPolicy, l *Limit) { l.MaxDelay.Duration = 2 * time.Minute },
			"spec.rules[0].limit.maxDelay", "must be between 1ms and 1m0s"},
		{"maxDelay not whole microseconds", func(_ *RateLimitPolicy, l *Limit) { l.MaxDelay.Duration = time.Second + time.Nanosecond },
			"spec.rules[0].limit.maxDelay", "whole number of microseconds"},
		{"maxDelay without Delay", func(_ *RateLimitPolicy, l *Limit) { l.OnExceed = "" },
			"spec.rules[0].limit.maxDelay", "applies only with onExceed: Delay"},
		{"delayAfter with Deny", func(_ *RateLimitPolicy, l *Limit) { l.OnExceed, l.MaxDelay.Duration, l.DelayAfter = OnExceedDeny, 0, 5 },
			"spec.rules[0].limit.delayAfter", "applies only with onExceed: Delay"},
		{"delayAfter over the bound", func(_ *RateLimitPolicy, l *Limit) { l.DelayAfter = 1_000_000_001 },
			"spec.rules[0].limit.delayAfter", "between 1 and 1000000000"},
		{"delayAfter too slow to refill", func(_ *RateLimitPolicy, l *Limit) {
			l.Requests, l.Per.Duration, l.DelayAfter = 1, 8784*time.Hour, 1000
		}, "spec.rules[0].limit.delayAfter", "takes longer than"},
		{"burst", func(_ *RateLimitPolicy, l *Limit) { l.Burst = 10 },
			"spec.rules[0].limit.burst", "delayAfter sets how many requests of a burst pass at once"},
		{"SlidingWindow", func(_ *RateLimitPolicy, l *Limit) { l.Algorithm = AlgorithmSlidingWindow },
			"spec.rules[0].limit.algorithm", `supported values: "TokenBucket", "GCRA"`},
		{"split", func(_ *RateLimitPolicy, l *Limit) { l.Split = 2 },
			"spec.rules[0].limit.split", "never splits"},
		{"lease Auto", func(_ *RateLimitPolicy, l *Limit) { l.Lease = LeaseAuto },
			"spec.rules[0].limit.lease", "never leases"},
		{"Shadow", func(p *RateLimitPolicy, _ *Limit) { p.Spec.Rules[0].Mode = ModeShadow },
			"spec.rules[0].mode", "cannot use onExceed: Delay"},
		{"cost above delayAfter", func(p *RateLimitPolicy, l *Limit) { l.DelayAfter, p.Spec.Rules[0].Cost = 2, &Cost{Default: 3} },
			"spec.rules[0].cost.default", "limit.delayAfter"},
		{"a targetRef", func(p *RateLimitPolicy, _ *Limit) {
			p.Spec.PodSelector = metav1.LabelSelector{}
			p.Spec.TargetRef = &TargetReference{Group: GatewayAPIGroup, Kind: KindHTTPRoute, Name: "api"}
		}, "spec.rules[0].limit.onExceed", "central rate-limit service answers the gateway allow or deny and cannot hold a request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := delayPolicy()
			tc.mutate(p, &p.Spec.Rules[0].Limit)
			errs := p.ValidateSemantics()
			for _, e := range errs {
				if e.Field == tc.field && strings.Contains(e.Error(), tc.detail) {
					return
				}
			}
			t.Errorf("ValidateSemantics() = %v, want an error on %s containing %q", errs.ToAggregate(), tc.field, tc.detail)
		})
	}
}

// A ClusterRateLimitPolicy's rules are held to the same checks.
func TestClusterValidateSemanticsRejectsDelayInShadow(t *testing.T) {
	t.Parallel()
	r := delayPolicy().Spec.Rules[0]
	r.Mode = ModeShadow
	c := &ClusterRateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "smooth"},
		Spec: ClusterRateLimitPolicySpec{Defaults: &ClusterRules{Rules: []Rule{r}}}}
	errs := c.ValidateSemantics()
	if len(errs) != 1 || errs[0].Field != "spec.defaults.rules[0].mode" {
		t.Errorf("ValidateSemantics() = %v, want one error on spec.defaults.rules[0].mode", errs.ToAggregate())
	}
}

func TestDelayCapacity(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 100, OnExceed: OnExceedDelay}
	if got, want := l.Capacity(), int64(1); got != want {
		t.Errorf("Capacity() of a Delay limit = %d, want %d", got, want)
	}
	l.DelayAfter = 20
	if got, want := l.Capacity(), int64(20); got != want {
		t.Errorf("Capacity() with delayAfter 20 = %d, want %d", got, want)
	}
}
