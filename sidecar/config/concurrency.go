package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds and defaults of concurrency rules and of the load shedder. The
// RateLimitPolicy API holds the same bounds (api/v1alpha1).
const (
	// MaxConcurrency bounds Concurrency.Max: the Redis store keeps one
	// sorted-set member per request in flight.
	MaxConcurrency = 100_000
	// MinLeaseTTL and MaxLeaseTTL bound Concurrency.LeaseTTL;
	// DefaultLeaseTTL applies when it is unset.
	MinLeaseTTL     = time.Second
	MaxLeaseTTL     = 10 * time.Minute
	DefaultLeaseTTL = 10 * time.Second
	// MaxSheddingLimit bounds LoadShedding.MinLimit and MaxLimit.
	MaxSheddingLimit = 100_000
	// DefaultSheddingMinLimit and DefaultSheddingMaxLimit apply when
	// LoadShedding.MinLimit or MaxLimit is unset.
	DefaultSheddingMinLimit = 4
	DefaultSheddingMaxLimit = 1000
	// DefaultCriticalReserve and DefaultDefaultReserve apply when a
	// Reserved percentage is unset; MaxReserved bounds their sum, so that
	// Sheddable requests keep a share of the limit.
	DefaultCriticalReserve = 20
	DefaultDefaultReserve  = 10
	MaxReserved            = 90
)

// Values of Rule.Priority, from the most to the least important.
const (
	PriorityCritical  = "Critical"
	PriorityDefault   = "Default"
	PrioritySheddable = "Sheddable"
)

// Concurrency caps the requests of a key in flight at once, over every
// replica together. A request holds a slot from its admission until its
// response is complete, its client goes away or its stream ends.
type Concurrency struct {
	// Max is the most requests of one key in flight at once.
	Max int64 `json:"max"`
	// LeaseTTL is how long a slot stays taken after its sidecar stops
	// renewing it (it crashed, or lost the store); 0 means
	// DefaultLeaseTTL.
	LeaseTTL metav1.Duration `json:"leaseTTL,omitzero"`
}

// TTL returns LeaseTTL, or DefaultLeaseTTL when it is unset.
func (c *Concurrency) TTL() time.Duration {
	if c.LeaseTTL.Duration == 0 {
		return DefaultLeaseTTL
	}
	return c.LeaseTTL.Duration
}

// LoadShedding configures the load shedder of the pods a policy selects.
type LoadShedding struct {
	// Mode is "Enforce" (default) or "Shadow": learn the limit and count
	// what would be shed, shed nothing.
	Mode string `json:"mode,omitempty"`
	// Reserved holds back shares of the limit for higher priorities.
	Reserved Reserved `json:"reserved,omitzero"`
	// MinLimit and MaxLimit bound the adaptive limit on requests in flight
	// to the application; 0 means DefaultSheddingMinLimit and
	// DefaultSheddingMaxLimit.
	MinLimit int32 `json:"minLimit,omitempty"`
	MaxLimit int32 `json:"maxLimit,omitempty"`
}

// Reserved are the percentages of the shedder's limit that lower
// priorities may not use. Nil means the default.
type Reserved struct {
	// Critical is the share only Critical requests may use.
	Critical *int32 `json:"critical,omitempty"`
	// Default is the further share Sheddable requests may not use.
	Default *int32 `json:"default,omitempty"`
}

// Shares returns the critical and default percentages, defaults applied.
func (r Reserved) Shares() (critical, deflt int32) {
	critical, deflt = DefaultCriticalReserve, DefaultDefaultReserve
	if r.Critical != nil {
		critical = *r.Critical
	}
	if r.Default != nil {
		deflt = *r.Default
	}
	return critical, deflt
}

// Limits returns MinLimit and MaxLimit, defaults applied.
func (l *LoadShedding) Limits() (lo, hi int32) {
	lo, hi = l.MinLimit, l.MaxLimit
	if lo == 0 {
		lo = DefaultSheddingMinLimit
	}
	if hi == 0 {
		hi = DefaultSheddingMaxLimit
	}
	return lo, hi
}

// IsRate reports whether the rule limits a rate: it has a Limit.
func (r *Rule) IsRate() bool { return r.Limit != (Limit{}) }

// validateKind checks what kind of rule r is: a rate (a Limit), a cap on
// requests in flight (Concurrency), or neither when it only sets a
// Priority. It reports whether the rule is a rate, whose limit and cost the
// caller checks.
func (r *Rule) validateKind(path string, errs *errList) (rate bool) {
	switch r.Priority {
	case "", PriorityCritical, PriorityDefault, PrioritySheddable:
	default:
		errs.add(path+".priority", "must be %s, %s or %s, got %q", PriorityCritical, PriorityDefault, PrioritySheddable, r.Priority)
	}
	rate = r.IsRate()
	switch {
	case rate && r.Concurrency != nil && r.Limit.Split != 0:
		errs.add(path+".limit.split", "does not apply to a concurrency rule: its slots are one count per key, held for the request's life")
		return false
	case rate && r.Concurrency != nil && r.Limit.Lease != "":
		errs.add(path+".limit.lease", "does not apply to a concurrency rule: each request takes its own slot from the store")
		return false
	case rate && r.Concurrency != nil:
		errs.add(path, "set limit (a rate) or concurrency (requests in flight), not both; use two rules for both")
		return false
	case r.Concurrency != nil:
		c := r.Concurrency
		if c.Max < 1 || c.Max > MaxConcurrency {
			errs.add(path+".concurrency.max", "must be between 1 and %d, got %d", MaxConcurrency, c.Max)
		}
		if ttl := c.LeaseTTL.Duration; ttl != 0 && (ttl < MinLeaseTTL || ttl > MaxLeaseTTL) {
			errs.add(path+".concurrency.leaseTTL", "must be between %v and %v, got %v", MinLeaseTTL, MaxLeaseTTL, ttl)
		}
		if r.Cost != (Cost{}) {
			errs.add(path+".cost", "cost applies to rate limits only: a concurrency rule holds one slot per request")
		}
	case !rate && r.Priority == "":
		errs.add(path, "a rule needs a limit, a concurrency cap, or a priority")
	case !rate:
		// Only a priority: the key, if any, is not read.
		if r.Cost != (Cost{}) {
			errs.add(path+".cost", "cost applies to rate limits only")
		}
	}
	return rate
}

// refuseAdmissionFields reports the fields a descriptor rule cannot have:
// the Envoy rate-limit service API has no call that ends a request, so it
// cannot release a concurrency slot, and it has no load shedder.
func (r *Rule) refuseAdmissionFields(path string, errs *errList) {
	if r.Concurrency != nil {
		errs.add(path+".concurrency", "a descriptor rule cannot cap requests in flight: the rate-limit service API has no call that ends a request")
	}
	if r.Priority != "" {
		errs.add(path+".priority", "a descriptor rule cannot set a priority: only the sidecar's HTTP front sheds load")
	}
}

func (l *LoadShedding) validate(path string, errs *errList) {
	switch l.Mode {
	case "", ModeEnforce, ModeShadow:
	default:
		errs.add(path+".mode", "must be %s or %s, got %q", ModeEnforce, ModeShadow, l.Mode)
	}
	for _, f := range []struct {
		name string
		v    *int32
	}{{"critical", l.Reserved.Critical}, {"default", l.Reserved.Default}} {
		if f.v != nil && (*f.v < 0 || *f.v > MaxReserved) {
			errs.add(path+".reserved."+f.name, "must be a percentage between 0 and %d, got %d", MaxReserved, *f.v)
		}
	}
	if c, d := l.Reserved.Shares(); c >= 0 && d >= 0 && c+d > MaxReserved {
		errs.add(path+".reserved", "critical and default together must reserve at most %d percent, so that Sheddable requests keep a share; got %d", MaxReserved, c+d)
	}
	for _, f := range []struct {
		name string
		v    int32
	}{{"minLimit", l.MinLimit}, {"maxLimit", l.MaxLimit}} {
		if f.v < 0 || f.v > MaxSheddingLimit {
			errs.add(path+"."+f.name, "must be between 1 and %d, got %d", MaxSheddingLimit, f.v)
		}
	}
	if lo, hi := l.Limits(); lo > hi && lo > 0 && hi > 0 {
		errs.add(path+".minLimit", "%d exceeds maxLimit %d", lo, hi)
	}
}
