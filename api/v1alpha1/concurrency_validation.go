package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// validateRuleKind checks that a rule is a rate (limit), a cap on requests
// in flight (concurrency), or only a priority, and the fields each kind
// takes. It mirrors the CEL rules on Rule.
func validateRuleKind(r *Rule, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, enumValue(path.Child("priority"), string(r.Priority),
		PriorityCritical, PriorityDefault, PrioritySheddable)...)
	rate := r.Limit != (Limit{})
	switch {
	case r.Concurrency != nil && r.Limit.Split != 0:
		errs = append(errs, field.Invalid(path.Child("limit", "split"), r.Limit.Split,
			"does not apply to a concurrency rule: its slots are one count per key, held for the request's life"))
	case r.Concurrency != nil && r.Limit.Lease != "":
		errs = append(errs, field.Invalid(path.Child("limit", "lease"), r.Limit.Lease,
			"does not apply to a concurrency rule: each request takes its own slot from the store"))
	case rate && r.Concurrency != nil:
		errs = append(errs, field.Invalid(path.Child("concurrency"), field.OmitValueType{},
			"set limit (a rate) or concurrency (requests in flight), not both; use two rules for both; limit.split does not apply to a concurrency cap"))
	case r.Concurrency != nil:
		c := r.Concurrency
		if c.Max < 1 || c.Max > maxConcurrency {
			errs = append(errs, field.Invalid(path.Child("concurrency", "max"), c.Max,
				fmt.Sprintf("must be between 1 and %d", maxConcurrency)))
		}
		if ttl := c.LeaseTTL; ttl != nil && (ttl.Duration < config.MinLeaseTTL || ttl.Duration > config.MaxLeaseTTL) {
			errs = append(errs, field.Invalid(path.Child("concurrency", "leaseTTL"), ttl.Duration.String(),
				fmt.Sprintf("must be between %v and %v", config.MinLeaseTTL, config.MaxLeaseTTL)))
		}
	case !rate && r.Priority == "":
		errs = append(errs, field.Required(path, "a rule needs a limit, a concurrency cap, or a priority"))
	}
	if r.Cost != nil && !rate {
		errs = append(errs, field.Invalid(path.Child("cost"), field.OmitValueType{},
			"cost applies to rate limits only: a concurrency rule holds one slot per request"))
	}
	return errs
}

// validateLoadShedding checks the shedder's settings; it mirrors their
// schema and CEL rules.
func validateLoadShedding(ls *LoadShedding, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, enumValue(path.Child("mode"), string(ls.Mode), ModeEnforce, ModeShadow)...)
	critical, deflt := int32(config.DefaultCriticalReserve), int32(config.DefaultDefaultReserve)
	if rs := ls.Reserved; rs != nil {
		for _, f := range []struct {
			name string
			v    *int32
			to   *int32
		}{{"critical", rs.Critical, &critical}, {"default", rs.Default, &deflt}} {
			if f.v == nil {
				continue
			}
			*f.to = *f.v
			if *f.v < 0 || *f.v > maxReserved {
				errs = append(errs, field.Invalid(path.Child("reserved", f.name), *f.v,
					fmt.Sprintf("must be a percentage between 0 and %d", maxReserved)))
			}
		}
	}
	if critical+deflt > maxReserved {
		errs = append(errs, field.Invalid(path.Child("reserved"), critical+deflt,
			"critical and default together must reserve at most 90 percent, so that Sheddable requests keep a share"))
	}
	for _, f := range []struct {
		name string
		v    int32
	}{{"minLimit", ls.MinLimit}, {"maxLimit", ls.MaxLimit}} {
		if f.v < 0 || f.v > maxSheddingLimit {
			errs = append(errs, field.Invalid(path.Child(f.name), f.v,
				fmt.Sprintf("must be between 1 and %d", maxSheddingLimit)))
		}
	}
	if ls.MinLimit > 0 && ls.MaxLimit > 0 && ls.MinLimit > ls.MaxLimit {
		errs = append(errs, field.Invalid(path.Child("minLimit"), ls.MinLimit, "minLimit must not exceed maxLimit"))
	}
	return errs
}
