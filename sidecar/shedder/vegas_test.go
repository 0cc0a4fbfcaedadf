package shedder

import (
	"math"
	"testing"
	"time"
)

// step is one window fed to a Vegas and the limit it must leave in force.
type step struct {
	at        time.Duration // the window's end, from the table's base
	latency   time.Duration
	inFlight  float64
	maxFlight int64
	want      float64
}

func runSteps(t *testing.T, v *Vegas, steps []step) {
	t.Helper()
	base := time.Unix(1_700_000_000, 0)
	for i, s := range steps {
		got := v.Update(Window{End: base.Add(s.at), Samples: 20, MeanLatency: s.latency, MeanInFlight: s.inFlight, MaxInFlight: s.maxFlight})
		if math.Abs(got-s.want) > 1e-9 {
			t.Errorf("step %d: Update(%v, latency %v, in flight %v, max %d) = %.3f, want %.3f",
				i, s.at, s.latency, s.inFlight, s.maxFlight, got, s.want)
		}
	}
}

const ms = time.Millisecond

func TestVegasGrowsWhileNothingQueues(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Hour})
	// log10(100) = 2: beta = 12. The first window sets the baseline.
	runSteps(t, v, []step{
		{100 * ms, 10 * ms, 60, 80, 112},
		{200 * ms, 10 * ms, 60, 80, 112 + 6*math.Log10(112)},
		// The application uses less than half the limit: no growth.
		{300 * ms, 10 * ms, 30, 40, 112 + 6*math.Log10(112)},
	})
}

func TestVegasHoldsAShortQueueAndCutsALongOne(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Hour})
	// Baseline 10ms. log10(100) = 2: threshold 2, alpha 6, beta 12.
	runSteps(t, v, []step{
		{100 * ms, 10 * ms, 80, 90, 112},
		// queue = 80 × (1 − 10/11) = 7.3: between alpha and beta, held.
		{200 * ms, 11 * ms, 80, 90, 112},
		// queue = 80 × (1 − 10/10.5) = 3.8: below alpha, + log10(112).
		{300 * ms, 10500 * time.Microsecond, 80, 90, 112 + math.Log10(112)},
		// queue = 80 × (1 − 10/20) = 40: 40 − beta over beta, cut by
		// the excess.
		{400 * ms, 20 * ms, 80, 100, (112 + math.Log10(112)) - (40 - 6*math.Log10(112+math.Log10(112)))},
	})
	// A huge queue cuts by half at most.
	l := v.Estimate()
	runSteps(t, v, []step{{500 * ms, 1000 * ms, 100, 100, l / 2}})
}

func TestVegasStaysWithinItsBounds(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{MinLimit: 8, MaxLimit: 30, InitialLimit: 25, ProbeEvery: time.Hour})
	runSteps(t, v, []step{
		{100 * ms, 10 * ms, 20, 25, 30},
		{200 * ms, 10 * ms, 20, 30, 30},
		{300 * ms, 1000 * ms, 30, 30, 15},
		{400 * ms, 1000 * ms, 30, 30, 8},
		{500 * ms, 1000 * ms, 30, 30, 8},
	})
	v.SetBounds(10, 12)
	if got := v.Estimate(); got != 10 {
		t.Errorf("Estimate() after SetBounds(10, 12) = %v, want 10", got)
	}
}

func TestVegasBaselineIsTheHorizonsLowest(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{BaselineHorizon: 60 * time.Second, BaselineBuckets: 6, ProbeEvery: time.Hour})
	base := time.Unix(1_700_000_000, 0)
	feed := func(at time.Duration, lat time.Duration) {
		v.Update(Window{End: base.Add(at), Samples: 20, MeanLatency: lat, MeanInFlight: 1, MaxInFlight: 1})
	}
	feed(0, 20*ms)
	feed(time.Second, 10*ms)
	feed(2*time.Second, 30*ms)
	if got := v.Baseline(); got != 10*ms {
		t.Fatalf("Baseline() = %v, want the lowest, 10ms", got)
	}
	// Sixty seconds on, the bucket holding 10ms is past the horizon.
	feed(59*time.Second, 15*ms)
	if got := v.Baseline(); got != 10*ms {
		t.Errorf("Baseline() at 59s = %v, want 10ms still", got)
	}
	feed(61*time.Second, 40*ms)
	if got := v.Baseline(); got != 15*ms {
		t.Errorf("Baseline() at 61s = %v, want 15ms (10ms aged out)", got)
	}
}

// A drain probe cuts the limit for its windows, which feed the baseline
// and nothing else, then the learned limit is back.
func TestVegasProbeDrainsThenRestores(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Second, ProbeWindows: 2, ProbeFactor: 0.75})
	runSteps(t, v, []step{
		{0, 20 * ms, 80, 90, 112},          // baseline 20ms; the next probe is due at 1s
		{500 * ms, 22 * ms, 80, 90, 112},   // a queue of 7.3: held
		{time.Second, 22 * ms, 80, 90, 84}, // due: cut to 0.75 × 112
		{1100 * ms, 12 * ms, 60, 70, 84},   // a probe window: 12ms becomes the baseline
		{1200 * ms, 12 * ms, 60, 70, 112},  // the last one: the limit is back
	})
	if got := v.Baseline(); got != 12*ms {
		t.Errorf("Baseline() after the probe = %v, want 12ms", got)
	}
	if v.Probing() {
		t.Error("Probing() after the probe's windows")
	}
}
