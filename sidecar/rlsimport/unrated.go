package rlsimport

import (
	"fmt"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Unrated is an HTTP rule that limits no rate, in words: a cap on requests
// in flight, or only a priority. floodgate-sidecar --check-config (Explain)
// and kubectl floodgate explain both word such a rule with it, so that the
// two say the same.
type Unrated struct {
	// Concurrency is a concurrency rule as the engine enforces it; nil
	// for a rule that only sets a priority.
	Concurrency *engine.ConcurrencyRule
	// Failure says what the rule does while the store is unreachable.
	Failure string
	// Limit says what the rule does to the requests it matches, after
	// the counter: "at most 10 requests in flight at once across replicas
	// (a crashed sidecar's slots come back after 10 s); fails open to 3 in
	// flight per replica on 3 replicas".
	Limit string
}

// DescribeUnrated words rule r of policy p, a rule without a limit (see
// config.Rule.IsRate), with the numbers the engine derives for it
// (engine.NewConcurrencyRule), which registers its metrics on m.
func DescribeUnrated(p *config.Policy, r *config.Rule, m *metrics.Metrics) (Unrated, error) {
	cc := r.Concurrency
	if cc == nil {
		return Unrated{Failure: "never counted", Limit: "no limit: marks the requests it matches " + r.Priority + " for the load shedder"}, nil
	}
	shadow := r.Mode == config.ModeShadow
	er, err := engine.NewConcurrencyRule(p.Name, r.Name, cc.Max, cc.TTL(), p.Replicas, r.FailureMode == config.FailureClosed, shadow, m)
	if err != nil {
		return Unrated{}, err
	}
	out := Unrated{Concurrency: er, Failure: "fails closed: 503 while the store is unreachable"}
	if !er.FailClosed {
		n := max(p.Replicas, 1)
		out.Failure = fmt.Sprintf("fails open to %d in flight per replica on %d %s", er.Fallback, n, plural(int64(n), "replica", "replicas"))
	}
	out.Limit = fmt.Sprintf("at most %d %s in flight at once across replicas (a crashed sidecar's slots come back after %s); %s",
		er.Max, plural(er.Max, "request", "requests"), Period(er.LeaseTTL), out.Failure)
	if shadow {
		out.Limit += "; shadow: counted and reported, never denies"
	}
	if r.Priority != "" {
		out.Limit += "; marks its requests " + r.Priority + " for the load shedder"
	}
	return out, nil
}

// HTTPRules words a number of HTTP rules, the rate rules and the
// concurrency rules together, as the config checks count them: "2 HTTP
// rules", or "3 HTTP rules (2 rate, 1 concurrency)" when some cap requests
// in flight. A rule that only sets a priority limits nothing and is not
// counted.
func HTTPRules(rate, concurrency int) string {
	s := fmt.Sprintf("%d HTTP rules", rate+concurrency)
	if concurrency > 0 {
		s += fmt.Sprintf(" (%d rate, %d concurrency)", rate, concurrency)
	}
	return s
}

// Period words a duration in the largest unit it is a whole number of:
// "second", "10 s", "minute", "2 min", "hour", "3 h", "day", "7 d".
func Period(d time.Duration) string {
	for _, u := range []struct {
		d         time.Duration
		one, many string
	}{{24 * time.Hour, "day", "d"}, {time.Hour, "hour", "h"}, {time.Minute, "minute", "min"}, {time.Second, "second", "s"}} {
		if d >= u.d && d%u.d == 0 {
			if d == u.d {
				return u.one
			}
			return strconv.FormatInt(int64(d/u.d), 10) + " " + u.many
		}
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
