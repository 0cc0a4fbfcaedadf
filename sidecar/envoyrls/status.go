package envoyrls

import (
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// statusBlock holds one descriptor status and the messages it points to,
// so that a status costs no allocation of its own.
type statusBlock struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	mult   wrapperspb.UInt32Value
	reset  durationpb.Duration
}

// answer1 is the whole answer to a call of one descriptor, the common
// case, in one allocation.
type answer1 struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	blocks   [1]statusBlock
}

// newAnswer returns an OK response with room for nd statuses, and the
// blocks to build them in. The statuses are left nil. Everything is new:
// the response outlives the call (gRPC marshals it afterwards), so none of
// it may be pooled.
func newAnswer(nd int) (*rlsv3.RateLimitResponse, []statusBlock) {
	if nd == 1 {
		a := &answer1{}
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
		a.resp.Statuses = a.statuses[:]
		return &a.resp, a.blocks[:]
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, nd)}
	return resp, make([]statusBlock, nd)
}

// view is what one status or header set reports about a rule's decision.
type view struct {
	rule      *ruleset.DescriptorRule
	denied    bool // enforced and not admitted
	remaining int64
	reset     time.Duration
	retry     time.Duration
	evaluated bool
}

// descriptorStatus builds descriptor i's status from its hits, in blk.
func (s *Server) descriptorStatus(i int, sc *scratch, v *engine.Verdict, now time.Time, blk *statusBlock) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &blk.status
	ds.Code = rlsv3.RateLimitResponse_OK
	n := sc.nodes[i]
	switch sc.kind[i] {
	case descRejected:
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		return ds
	case descOrdinary:
		if n == nil {
			return ds
		}
	}
	var best *view
	var cand view
	pick := func(c view) {
		switch {
		case best == nil:
		case c.denied != best.denied:
			if !c.denied {
				return
			}
		case c.denied:
			if c.retry <= best.retry {
				return
			}
		case c.rule.Shadow != best.rule.Shadow:
			if c.rule.Shadow {
				return
			}
		case c.rule.Fields.Quiet() != best.rule.Fields.Quiet():
			// A rule that shows its numbers describes the descriptor
			// before one that hides them.
			if c.rule.Fields.Quiet() {
				return
			}
		case c.remaining >= best.remaining:
			return
		}
		cand = c
		best = &cand
	}
	unlimited := false
	for _, b := range sc.blocks {
		if b.desc == i {
			pick(blockView(b.rule, now))
		}
	}
	for j := range sc.hits {
		if int(sc.owner[j]) != i {
			continue
		}
		pick(hitView(sc.hrule[j], j, v))
	}
	if best == nil {
		if n == nil {
			return ds
		}
		for _, r := range n.Rules {
			if r.Unlimited && !replaced(sc.drop, r) {
				unlimited = true
			}
		}
		if unlimited {
			ds.LimitRemaining = math.MaxUint32
		}
		return ds
	}
	if best.denied {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if best.rule.Fields.Quiet() {
		// Envoy makes its own X-RateLimit fields of these numbers
		// (enable_x_ratelimit_headers): a rule that hides them answers
		// the code alone.
		return ds
	}
	ds.CurrentLimit = currentLimit(best.rule, blk)
	ds.LimitRemaining = uint32(min(max(best.remaining, 0), math.MaxUint32))
	if best.evaluated {
		blk.reset.Seconds = ratelimitheaders.CeilSeconds(max(best.reset, best.retry), 0)
		ds.DurationUntilReset = &blk.reset
	}
	return ds
}

func hitView(r *ruleset.DescriptorRule, j int, v *engine.Verdict) view {
	res := v.Results[j]
	c := view{rule: r, remaining: res.Remaining, reset: res.ResetAfter, retry: res.RetryAfter, evaluated: res.Source != engine.NotEvaluated}
	switch {
	case !c.evaluated:
		// Decided before this hit was checked: the call took nothing.
		c.remaining = 0
	case res.Source == engine.FromNowhere:
		c.denied, c.remaining = !r.Shadow, 0
	case !res.Allowed:
		c.denied, c.remaining = !r.Shadow, 0
	}
	return c
}

// blockView reports a rule that denies every call: nothing remains until
// the end of its window.
func blockView(r *ruleset.DescriptorRule, now time.Time) view {
	left := windowLeft(r, now)
	return view{rule: r, denied: !r.Shadow, remaining: 0, reset: left, retry: left, evaluated: true}
}

// windowLeft is what is left at now of the current window of rule r, whose
// windows are aligned to the Unix epoch.
func windowLeft(r *ruleset.DescriptorRule, now time.Time) time.Duration {
	p := r.Limit.Period
	return p - time.Duration(now.UnixNano()%int64(p))
}

// currentLimit expresses a rule's limit in Envoy's units, in blk: the
// largest unit that divides the period, with a multiplier when it is not 1.
func currentLimit(r *ruleset.DescriptorRule, blk *statusBlock) *rlsv3.RateLimitResponse_RateLimit {
	l := &blk.limit
	l.Name, l.RequestsPerUnit = r.PolicyName, uint32(min(r.Limit.Requests, math.MaxUint32))
	p := r.Limit.Period
	for _, u := range units {
		if p%u.d == 0 {
			l.Unit = u.unit
			if m := p / u.d; m != 1 {
				blk.mult.Value = uint32(min(int64(m), math.MaxUint32))
				l.UnitMultiplier = &blk.mult
			}
			return l
		}
	}
	return l
}

var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}
