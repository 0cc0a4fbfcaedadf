package match

import (
	"fmt"
	"net/netip"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/expr"
)

// Exemption decides whether a rule leaves a request alone: the exempt
// sections of the rule and of its policy, either of which is enough. It is
// immutable and safe for concurrent use.
type Exemption struct {
	policy *descriptor.Policy
	cidrs  []netip.Prefix
	// when has one program per section with conditions; each holds when
	// all of its section's conditions do.
	when []*expr.Program
}

// NewExemption compiles the exempt sections of a rule and its policy,
// either of which may be nil. It returns nil when there is nothing to
// exempt.
func NewExemption(pol *descriptor.Policy, sections ...*config.Exempt) (*Exemption, error) {
	x := &Exemption{policy: pol}
	for _, sec := range sections {
		if sec == nil {
			continue
		}
		ps, err := prefixes(sec.SourceCIDRs)
		if err != nil {
			return nil, fmt.Errorf("exempt.sourceCIDRs: %w", err)
		}
		x.cidrs = append(x.cidrs, ps...)
		if len(sec.When) > 0 {
			prog, err := expr.CompileConditions(sec.When)
			if err != nil {
				return nil, fmt.Errorf("exempt.%w", err)
			}
			x.when = append(x.when, prog)
		}
	}
	if len(x.cidrs) == 0 && len(x.when) == 0 {
		return nil, nil
	}
	if pol == nil {
		return nil, fmt.Errorf("exempt: needs the rule's policy")
	}
	return x, nil
}

// Holds reports whether the request is exempt. A nil *Exemption exempts
// nothing.
func (x *Exemption) Holds(r *descriptor.Request) bool {
	if x == nil {
		return false
	}
	if len(x.cidrs) > 0 && contains(x.cidrs, r.ClientIP(x.policy)) {
		return true
	}
	for _, w := range x.when {
		if w.Holds(r.Activation(x.policy)) {
			return true
		}
	}
	return false
}

// Programs returns the exemption's CEL conditions, for reporting how they
// run (expr.Program.Native).
func (x *Exemption) Programs() []*expr.Program {
	if x == nil {
		return nil
	}
	return x.when
}
