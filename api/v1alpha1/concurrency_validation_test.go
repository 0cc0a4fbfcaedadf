package v1alpha1

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// admissionPolicy has a concurrency rule, rules that only set a priority,
// and the load shedder with every field set.
func admissionPolicy() *RateLimitPolicy {
	p := validPolicy()
	ttl := metav1.Duration{Duration: 30 * time.Second}
	critical, deflt := int32(30), int32(20)
	p.Spec.Rules = append(p.Spec.Rules,
		Rule{Name: "exports", Key: []KeyPart{{Header: "X-Tenant"}}, Concurrency: &Concurrency{Max: 10, LeaseTTL: &ttl}},
		Rule{Name: "pay", Match: &RuleMatch{Path: &PathMatch{Value: "/pay"}}, Priority: PriorityCritical},
		Rule{Name: "reports", Priority: PrioritySheddable},
	)
	p.Spec.Rules[1].Priority = PriorityDefault
	p.Spec.LoadShedding = &LoadShedding{Mode: ModeShadow, Reserved: &ReservedShares{Critical: &critical, Default: &deflt}, MinLimit: 2, MaxLimit: 500}
	return p
}

func TestValidateSemanticsAcceptsConcurrencyAndShedding(t *testing.T) {
	t.Parallel()
	if errs := admissionPolicy().ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
	// The bounds pass, and every default may be left to the API server.
	p := admissionPolicy()
	p.Spec.Rules[2].Concurrency = &Concurrency{Max: 100_000}
	// A concurrency rule with no key caps every request it matches together.
	p.Spec.Rules[2].Key = nil
	p.Spec.LoadShedding = &LoadShedding{}
	if errs := p.ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() with the bounds and defaults = %v, want no errors", errs.ToAggregate())
	}
}

func TestValidateSemanticsRejectsBadConcurrencyAndShedding(t *testing.T) {
	t.Parallel()
	i32 := func(v int32) *int32 { return &v }
	for _, tc := range []struct {
		name   string
		mutate func(p *RateLimitPolicy)
		field  string
		detail string
	}{
		{"limit and concurrency", func(p *RateLimitPolicy) { p.Spec.Rules[0].Concurrency = &Concurrency{Max: 1} },
			"spec.rules[0].concurrency", "not both"},
		{"neither limit, concurrency nor priority", func(p *RateLimitPolicy) { p.Spec.Rules[2].Concurrency = nil },
			"spec.rules[2]", "needs a limit, a concurrency cap, or a priority"},
		{"concurrency with limit.split", func(p *RateLimitPolicy) { p.Spec.Rules[2].Limit = Limit{Split: 3} },
			"spec.rules[2].limit.split", "does not apply to a concurrency rule"},
		{"concurrency with limit.lease", func(p *RateLimitPolicy) { p.Spec.Rules[2].Limit = Limit{Lease: LeaseOff} },
			"spec.rules[2].limit.lease", "does not apply to a concurrency rule"},
		{"max 0", func(p *RateLimitPolicy) { p.Spec.Rules[2].Concurrency.Max = 0 },
			"spec.rules[2].concurrency.max", "between 1 and 100000"},
		{"max above the bound", func(p *RateLimitPolicy) { p.Spec.Rules[2].Concurrency.Max = 100_001 },
			"spec.rules[2].concurrency.max", "between 1 and 100000"},
		{"lease TTL below 1s", func(p *RateLimitPolicy) {
			p.Spec.Rules[2].Concurrency.LeaseTTL = &metav1.Duration{Duration: 500 * time.Millisecond}
		}, "spec.rules[2].concurrency.leaseTTL", "between 1s and 10m"},
		{"lease TTL above 10m", func(p *RateLimitPolicy) {
			p.Spec.Rules[2].Concurrency.LeaseTTL = &metav1.Duration{Duration: time.Hour}
		}, "spec.rules[2].concurrency.leaseTTL", "between 1s and 10m"},
		{"cost on a concurrency rule", func(p *RateLimitPolicy) { p.Spec.Rules[2].Cost = &Cost{Default: 1} },
			"spec.rules[2].cost", "rate limits only"},
		{"unknown priority", func(p *RateLimitPolicy) { p.Spec.Rules[3].Priority = "Urgent" },
			"spec.rules[3].priority", "Unsupported value"},
		{"unknown shedding mode", func(p *RateLimitPolicy) { p.Spec.LoadShedding.Mode = "Off" },
			"spec.loadShedding.mode", "Unsupported value"},
		{"negative reserve", func(p *RateLimitPolicy) { p.Spec.LoadShedding.Reserved.Critical = i32(-1) },
			"spec.loadShedding.reserved.critical", "between 0 and 90"},
		{"reserves above 90 together", func(p *RateLimitPolicy) {
			p.Spec.LoadShedding.Reserved = &ReservedShares{Critical: i32(81)}
		}, "spec.loadShedding.reserved", "at most 90 percent"},
		{"minLimit above maxLimit", func(p *RateLimitPolicy) { p.Spec.LoadShedding.MinLimit = 600 },
			"spec.loadShedding.minLimit", "must not exceed maxLimit"},
		{"maxLimit above the bound", func(p *RateLimitPolicy) { p.Spec.LoadShedding.MaxLimit = 100_001 },
			"spec.loadShedding.maxLimit", "between 1 and 100000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := admissionPolicy()
			tc.mutate(p)
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

// The CRD's markers for the new fields hold the sidecar's bounds and
// defaults as literals; this fails when one and its constant disagree.
func TestCRDMarkersHoldTheAdmissionBounds(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../config/crd/bases/ratelimit.floodgate.dev_ratelimitpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	rule := spec.Properties["rules"].Items.Schema
	conc := rule.Properties["concurrency"]
	ls := spec.Properties["loadShedding"]
	res := ls.Properties["reserved"]
	for _, tc := range []struct {
		name string
		got  *float64
		want int64
	}{
		{"concurrency.max maximum", conc.Properties["max"].Maximum, config.MaxConcurrency},
		{"loadShedding.minLimit maximum", ls.Properties["minLimit"].Maximum, config.MaxSheddingLimit},
		{"loadShedding.maxLimit maximum", ls.Properties["maxLimit"].Maximum, config.MaxSheddingLimit},
		{"loadShedding.reserved.critical maximum", res.Properties["critical"].Maximum, config.MaxReserved},
		{"loadShedding.reserved.default maximum", res.Properties["default"].Maximum, config.MaxReserved},
	} {
		if tc.got == nil || *tc.got != float64(tc.want) {
			t.Errorf("%s = %v, want %d", tc.name, derefF(tc.got), tc.want)
		}
	}
	durations := regexp.MustCompile(`duration\('([^']+)'\)`)
	var ttl []time.Duration
	for _, v := range conc.Properties["leaseTTL"].XValidations {
		for _, m := range durations.FindAllStringSubmatch(v.Rule, -1) {
			if d, err := time.ParseDuration(m[1]); err == nil {
				ttl = append(ttl, d)
			}
		}
	}
	if len(ttl) != 2 || ttl[0] != config.MinLeaseTTL || ttl[1] != config.MaxLeaseTTL {
		t.Errorf("concurrency.leaseTTL rule bounds %v, want [%v %v]", ttl, config.MinLeaseTTL, config.MaxLeaseTTL)
	}
	// The reserves' CEL rule applies the defaults the sidecar applies.
	sum := regexp.MustCompile(`self\.critical : (\d+)\) \+ \(has\(self\.default\) \? self\.default : (\d+)\) <= (\d+)`)
	found := false
	for _, v := range res.XValidations {
		m := sum.FindStringSubmatch(v.Rule)
		if m == nil {
			continue
		}
		found = true
		if got, want := strings.Join(m[1:], ","), "20,10,90"; got != want ||
			config.DefaultCriticalReserve != 20 || config.DefaultDefaultReserve != 10 || config.MaxReserved != 90 {
			t.Errorf("reserved rule defaults and bound %s, want %d,%d,%d", got, config.DefaultCriticalReserve, config.DefaultDefaultReserve, config.MaxReserved)
		}
	}
	if !found {
		t.Error("no sum rule on spec.loadShedding.reserved")
	}
}
