package limiter_test

import (
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

// TestTables runs the conformance step tables against the pure algorithms.
func TestTables(t *testing.T) {
	t.Parallel()
	for _, tb := range limitertest.Tables() {
		t.Run(tb.Name, func(t *testing.T) {
			t.Parallel()
			lim, err := limiter.New(tb.Limit)
			if err != nil {
				t.Fatal(err)
			}
			limitertest.RunTable(t, tb, func(at time.Time, n int64, l limiter.Limit) (limiter.Decision, error) {
				if l != lim.Limit() {
					if err := lim.SetLimit(l); err != nil {
						return limiter.Decision{}, err
					}
				}
				return lim.AllowN(at, n)
			})
		})
	}
}

// TestTablesAgainstModel checks the hand-written tables themselves against
// the brute-force model, for the tables without limit edits or clock jumps
// backwards (which the model does not describe the same way for GCRA).
func TestTablesAgainstModel(t *testing.T) {
	t.Parallel()
	for _, tb := range limitertest.Tables() {
		t.Run(tb.Name, func(t *testing.T) {
			t.Parallel()
			m, err := limitertest.NewModel(tb.Limit)
			if err != nil {
				t.Fatal(err)
			}
			var last time.Duration
			for i, s := range tb.Steps {
				if s.Edit != nil || s.At < last {
					return
				}
				last = s.At
				at := tb.Base.Add(s.At)
				if got := m.AllowN(at.UnixMicro(), s.Cost); got != s.Want {
					t.Errorf("step %d: AllowN(%v, %v) = %v, want %v (model)", i, at, s.Cost, got, s.Want)
				}
			}
		})
	}
}
