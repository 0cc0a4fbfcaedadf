package envoyrls

import (
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
)

// headers builds the response fields of the call's binding rule.
func (s *Server) headers(sc *scratch, v *engine.Verdict, blocked bool, now time.Time) []*corev3.HeaderValue {
	var b view
	switch {
	case blocked:
		for _, bh := range sc.blocks {
			if !bh.rule.Shadow {
				b = blockView(bh.rule, now)
				break
			}
		}
	case v.Binding >= 0:
		b = hitView(sc.hrule[v.Binding], v.Binding, v)
	default:
		return nil
	}
	reset := max(b.reset, b.retry)
	resetSec := strconv.FormatInt(ceilSeconds(reset, 0), 10)
	remaining := strconv.FormatInt(b.remaining, 10)
	lim := b.rule.Limit
	capacity := lim.Capacity()
	name := strconv.Quote(b.rule.PolicyName)
	hs := []*corev3.HeaderValue{
		{Key: "X-RateLimit-Limit", Value: strconv.FormatInt(capacity, 10)},
		{Key: "X-RateLimit-Remaining", Value: remaining},
		{Key: "X-RateLimit-Reset", Value: resetSec},
		{Key: "RateLimit-Policy", Value: name + ";q=" + strconv.FormatInt(lim.Requests, 10) + ";w=" + strconv.FormatInt(int64(lim.Period/time.Second), 10)},
		{Key: "RateLimit", Value: name + ";r=" + remaining + ";t=" + resetSec},
	}
	if b.denied {
		retry := b.retry
		if retry <= 0 {
			retry = reset
		}
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ceilSeconds(retry, 1), 10)})
	}
	return hs
}

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	return max(int64((d+time.Second-1)/time.Second), floor)
}
