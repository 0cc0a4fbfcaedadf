package envoyrls

import (
	"context"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// scratch is the per-call working space, pooled.
type scratch struct {
	hits   []engine.Hit
	owner  []int32 // descriptor of each hit
	hrule  []*ruleset.DescriptorRule
	nodes  []*ruleset.DescriptorNode
	costs  []int64
	drop   []*ruleset.DescriptorRule
	blocks []blockHit
	v      engine.Verdict
	buf    []byte
	// kind says what each descriptor of the call is (descOrdinary,
	// descRequest or descRejected); http rebuilds request descriptors.
	kind []descKind
	http httpView
}

// descKind is what a descriptor of a call is.
type descKind uint8

const (
	// descOrdinary is matched against the descriptor rules.
	descOrdinary descKind = iota
	// descRequest is a request descriptor (request.go).
	descRequest
	// descRejected is a request descriptor that a rule rejected.
	descRejected
)

type blockHit struct {
	desc int
	rule *ruleset.DescriptorRule
}

// decide answers a valid call on the rules in force: it matches each
// descriptor, puts every counted hit into one engine decision, and builds
// the statuses, the response fields and the deny events.
func (s *Server) decide(ctx context.Context, st *state, req *rlsv3.RateLimitRequest, sc *scratch) *rlsv3.RateLimitResponse {
	resp, blocks := newAnswer(len(req.Descriptors))
	root := st.set.Descriptors.Domain(req.Domain)
	sc.kind = sc.kind[:0]
	requests := false
	for _, d := range req.Descriptors {
		k := descOrdinary
		if isRequest(d) {
			k, requests = descRequest, true
		}
		sc.kind = append(sc.kind, k)
	}
	if root == nil && !requests {
		// Unknown domain: nothing applies, as in envoyproxy/ratelimit.
		for i := range blocks {
			blocks[i].status.Code = rlsv3.RateLimitResponse_OK
			resp.Statuses[i] = &blocks[i].status
		}
		return resp
	}

	// Walk every descriptor and collect what the matched rules replace.
	sc.nodes = sc.nodes[:0]
	sc.drop = sc.drop[:0]
	for i, d := range req.Descriptors {
		if sc.kind[i] != descOrdinary {
			sc.nodes = append(sc.nodes, nil)
			continue
		}
		n := root
		for _, e := range d.Entries {
			if n = n.Next(e.Key, e.Value); n == nil {
				break
			}
		}
		sc.nodes = append(sc.nodes, n)
		if n != nil {
			for _, r := range n.Rules {
				sc.drop = append(sc.drop, r.Replaces...)
			}
		}
	}

	// Build the hits.
	sc.hits, sc.owner, sc.hrule, sc.blocks = sc.hits[:0], sc.owner[:0], sc.hrule[:0], sc.blocks[:0]
	sc.costs = sc.costs[:0]
	blocked := false
	for i, n := range sc.nodes {
		cost := costOf(req, req.Descriptors[i])
		sc.costs = append(sc.costs, cost)
		if sc.kind[i] == descRequest {
			from := len(sc.hits)
			if s.requestHits(st, i, req.Descriptors[i], sc) {
				// Rejected: none of its hits count, and the call is
				// refused without charging any enforced rule.
				sc.hits, sc.owner, sc.hrule = sc.hits[:from], sc.owner[:from], sc.hrule[:from]
				sc.kind[i], blocked = descRejected, true
			}
			continue
		}
		if n == nil {
			continue
		}
		var hash descriptor.Hash
		hashed := false
		for _, r := range n.Rules {
			if replaced(sc.drop, r) {
				continue
			}
			switch {
			case r.Unlimited:
				r.Metrics.Allowed.Inc()
			case r.Block:
				sc.blocks = append(sc.blocks, blockHit{desc: i, rule: r})
				if r.Shadow {
					r.Metrics.ShadowDenied.Inc()
				} else {
					blocked = true
					r.Metrics.Denied.Inc()
				}
			default:
				if !hashed {
					hash, sc.buf = entriesHash(req.Descriptors[i].Entries, sc.buf)
					hashed = true
				}
				sc.hits = append(sc.hits, engine.Hit{Rule: r.Engine, Key: hash.Key(r.Prefix), Cost: cost})
				sc.owner = append(sc.owner, int32(i))
				sc.hrule = append(sc.hrule, r)
			}
		}
	}
	if blocked {
		// A rule that denies every call matched, or a rule rejected a
		// request: charge no enforced rule.
		k := 0
		for j := range sc.hits {
			if sc.hits[j].Rule.Shadow {
				sc.hits[k], sc.owner[k], sc.hrule[k] = sc.hits[j], sc.owner[j], sc.hrule[j]
				k++
			}
		}
		sc.hits, sc.owner, sc.hrule = sc.hits[:k], sc.owner[:k], sc.hrule[:k]
	}
	v := &sc.v
	if len(sc.hits) > 0 {
		st.eng.Decide(ctx, sc.hits, v)
		// A rule that would delay the request (onExceed: Delay) cannot
		// here: the gateway asks yes or no. The request is refused and
		// gives its slot back.
		st.eng.RefuseDelayed(ctx, sc.hits, v)
	} else {
		v.Outcome, v.Binding, v.Results = engine.Allow, -1, v.Results[:0]
	}
	if blocked || v.Outcome != engine.Allow {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}

	now := time.Now()
	for i := range resp.Statuses {
		resp.Statuses[i] = s.descriptorStatus(i, sc, v, now, &blocks[i])
	}
	if s.o.ResponseHeaders {
		resp.ResponseHeadersToAdd = s.headers(sc, v, blocked, now)
	}
	s.publish(ctx, req, sc, v)
	return resp
}

// replaced reports whether r is among the replaced rules.
func replaced(drop []*ruleset.DescriptorRule, r *ruleset.DescriptorRule) bool {
	for _, d := range drop {
		if d == r {
			return true
		}
	}
	return false
}

// entriesHash returns the hash of a descriptor's entries, each entry's
// key and value a field of the hash input (see package descriptor), and
// buf, the input's buffer, for reuse.
func entriesHash(es []*rlcommonv3.RateLimitDescriptor_Entry, buf []byte) (descriptor.Hash, []byte) {
	buf = buf[:0]
	for _, e := range es {
		buf = descriptor.AppendField(buf, e.Key)
		buf = descriptor.AppendField(buf, e.Value)
	}
	return descriptor.Sum(buf), buf
}

// publish queues a deny event for each denying hit, shadow ones included.
func (s *Server) publish(ctx context.Context, req *rlsv3.RateLimitRequest, sc *scratch, v *engine.Verdict) {
	if s.o.Events == nil {
		return
	}
	var addr string
	for j := range v.Results {
		if !events.Denied(&v.Results[j]) {
			continue
		}
		if sc.kind[sc.owner[j]] == descRequest {
			method, path, client := requestEvent(req.Descriptors[sc.owner[j]])
			s.o.Events.Publish(events.Deny(time.Now(), &sc.hits[j], &v.Results[j], method, path, client))
			continue
		}
		if addr == "" {
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
				addr = p.Addr.String()
			}
		}
		s.o.Events.Publish(events.Deny(time.Now(), &sc.hits[j], &v.Results[j], "ShouldRateLimit", "", addr))
	}
}
