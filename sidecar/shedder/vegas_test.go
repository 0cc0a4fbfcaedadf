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
	// log10(100) = 2: beta = 8. The first window sets the baseline.
	runSteps(t, v, []step{
		{100 * ms, 10 * ms, 60, 80, 108},
		{200 * ms, 10 * ms, 60, 80, 108 + 4*math.Log10(108)},
		// The application uses less than half the limit: no growth.
		{300 * ms, 10 * ms, 30, 40, 108 + 4*math.Log10(108)},
	})
}

func TestVegasHoldsAShortQueueAndCutsALongOne(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Hour})
	// Baseline 10ms. log10(100) = 2: threshold 2, alpha 4, beta 8.
	runSteps(t, v, []step{
		{100 * ms, 10 * ms, 80, 90, 108},
		// queue = 80 × (1 − 10/11) = 7.3: between alpha and beta
		// (4.07 and 8.13 at 108), held.
		{200 * ms, 11 * ms, 80, 90, 108},
		// queue = 80 × (1 − 10/10.3) = 2.3: below alpha, above
		// log10(108), + log10(108).
		{300 * ms, 10300 * time.Microsecond, 80, 90, 108 + math.Log10(108)},
		// queue = 80 × (1 − 10/20) = 40: 40 − beta over beta, cut by
		// the excess.
		{400 * ms, 20 * ms, 80, 100, (108 + math.Log10(108)) - (40 - 4*math.Log10(108+math.Log10(108)))},
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
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Second, ProbeWindows: 2})
	runSteps(t, v, []step{
		{0, 20 * ms, 80, 90, 108},          // baseline 20ms; the next probe is due at 1s
		{500 * ms, 22 * ms, 80, 90, 108},   // a queue of 7.3: held
		{time.Second, 22 * ms, 80, 90, 54}, // due: cut to the default 0.5 × 108
		{1100 * ms, 12 * ms, 50, 54, 54},   // a probe window: 12ms becomes the baseline
		{1200 * ms, 12 * ms, 50, 54, 108},  // the last one: the limit is back
	})
	if got := v.Baseline(); got != 12*ms {
		t.Errorf("Baseline() after the probe = %v, want 12ms", got)
	}
	if v.Probing() {
		t.Error("Probing() after the probe's windows")
	}
}

// A probe that falls due while nothing queues is put off: the window
// already shows the baseline, and a cut limit could only shed.
func TestVegasProbeWaitsForAQueue(t *testing.T) {
	t.Parallel()
	v := NewVegas(VegasConfig{InitialLimit: 100, ProbeEvery: time.Second, ProbeWindows: 2})
	runSteps(t, v, []step{
		{0, 20 * ms, 60, 70, 108},                               // baseline 20ms; a probe due at 1s
		{time.Second, 20 * ms, 60, 70, 108 + 4*math.Log10(108)}, // due, but no queue: no cut
	})
	if v.Probing() {
		t.Fatal("Probing() in a window without a queue")
	}
	l := v.Estimate()
	runSteps(t, v, []step{
		{1500 * ms, 22 * ms, 80, 90, l},           // a queue of 7.3, held; the put-off probe is due at 2s
		{2 * time.Second, 22 * ms, 80, 90, l / 2}, // due with a queue: cut
	})
}
