package compiler

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// compileKind finishes a compiled rule that is not a rate: a concurrency
// cap carries no limit and no cost, with its lease TTL written out; a rule
// that only sets a priority carries neither, nor a key. A rate rule is left
// as compileRule built it. The priority is copied for every kind.
func compileKind(r *v1alpha1.Rule, out *config.Rule) {
	out.Priority = string(r.Priority)
	if r.Limit != (v1alpha1.Limit{}) {
		return
	}
	out.Limit, out.Cost = config.Limit{}, config.Cost{}
	if c := r.Concurrency; c != nil {
		ttl := config.DefaultLeaseTTL
		if c.LeaseTTL != nil {
			ttl = c.LeaseTTL.Duration
		}
		out.Concurrency = &config.Concurrency{Max: c.Max, LeaseTTL: metav1.Duration{Duration: ttl}}
		return
	}
	// Only a priority: matching is all the sidecar does with the rule.
	out.Key, out.Keys, out.OnMissingKey, out.FailureMode, out.Mode = out.Key[:0], nil, "", "", ""
}

// compileLoadShedding writes the shedder's settings out with every default
// applied, so the document says what the sidecars do.
func compileLoadShedding(ls *v1alpha1.LoadShedding) *config.LoadShedding {
	if ls == nil {
		return nil
	}
	out := &config.LoadShedding{Mode: or(string(ls.Mode), config.ModeEnforce), MinLimit: ls.MinLimit, MaxLimit: ls.MaxLimit}
	var rs config.Reserved
	if ls.Reserved != nil {
		rs = config.Reserved{Critical: ls.Reserved.Critical, Default: ls.Reserved.Default}
	}
	critical, deflt := rs.Shares()
	out.Reserved = config.Reserved{Critical: &critical, Default: &deflt}
	out.MinLimit, out.MaxLimit = out.Limits()
	return out
}
