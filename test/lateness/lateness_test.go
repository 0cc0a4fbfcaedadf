package lateness

import (
	"maps"
	"math"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"2771553163 96104217 5307\n", 96104217, true},
		{"0 0 0", 0, true},
		{"12 34", 34, true},
		{"12", 0, false},
		{"", 0, false},
		{"12 x 3", 0, false},
	} {
		got, ok := parseSchedstat(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseSchedstat(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestGrown(t *testing.T) {
	t.Parallel()
	// Bucket i holds [buckets[i], buckets[i+1]).
	buckets := []float64{math.Inf(-1), 0, 1e-3, 5e-3, math.Inf(1)}
	for _, tc := range []struct {
		prev, cur []uint64
		want      time.Duration
	}{
		{[]uint64{0, 4, 2, 0}, []uint64{0, 4, 2, 0}, 0},
		{[]uint64{0, 4, 2, 0}, []uint64{0, 9, 2, 0}, 0}, // [0, 1ms): its bound is 0
		{[]uint64{0, 4, 2, 0}, []uint64{0, 9, 3, 0}, time.Millisecond},
		{[]uint64{0, 4, 2, 0}, []uint64{0, 4, 3, 1}, 5 * time.Millisecond},
		{[]uint64{3, 4, 2, 0}, []uint64{4, 4, 2, 0}, 0}, // -Inf
	} {
		if got := grown(tc.prev, tc.cur, buckets); got != tc.want {
			t.Errorf("grown(%v, %v) = %v, want %v", tc.prev, tc.cur, got, tc.want)
		}
	}
}

func TestSince(t *testing.T) {
	t.Parallel()
	prev := map[int]time.Duration{1: 10, 2: 20, 3: 30}
	cur := map[int]time.Duration{1: 15, 2: 20, 3: 29, 4: 40}
	if got, want := since(prev, cur), map[int]time.Duration{1: 5}; !maps.Equal(got, want) {
		t.Errorf("since(%v, %v) = %v, want %v", prev, cur, got, want)
	}
	if got := since(prev, prev); got != nil {
		t.Errorf("since(prev, prev) = %v, want nil", got)
	}
}

// TestDuring sums synthetic samples over spans: sleeps by overlap,
// run-queue waits by interval, each thread's waits summed over the
// intervals of the span and kept apart from the watched processes'.
func TestDuring(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 23, 41, 42, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	sleep := func(from, to int) sleepSample {
		return sleepSample{start: at(from), end: at(to), late: ms(to-from) - 10*time.Millisecond}
	}
	p := &Probe{
		sleep: 10 * time.Millisecond,
		// In the order of their ends, as End leaves them: the late one,
		// from 20 to 45, ends after punctual ones that began later.
		sleeps: []sleepSample{
			sleep(0, 11),
			sleep(11, 21),
			sleep(25, 36),
			sleep(30, 40),
			sleep(20, 45),
			sleep(50, 62),
		},
		maxLate: 15 * time.Millisecond,
		runq: []runqSample{
			{from: at(0), to: at(10), worst: ms(1)},
			{from: at(10), to: at(20), worst: ms(4)},
			{from: at(20), to: at(30), worst: ms(2)},
			{from: at(30), to: at(40)},
		},
		waits: []waitSample{
			{from: at(0), to: at(10), own: map[int]time.Duration{1: ms(3)}},
			{from: at(10), to: at(20), own: map[int]time.Duration{1: ms(2), 2: ms(4)}, others: map[int]time.Duration{100: ms(7)}},
			{from: at(20), to: at(30), own: map[int]time.Duration{1: ms(3)}, others: map[int]time.Duration{100: ms(1), 200: ms(6)}},
			{from: at(30), to: at(40)},
		},
	}
	for i, tc := range []struct {
		from, to int
		want     Delays
	}{
		{0, 5, Delays{Timer: ms(1), Goroutine: ms(1), Thread: ms(3), Held: ms(3)}},
		// The late sleep began at 20: it counts from there, found past
		// the punctual ones that end before it.
		{20, 22, Delays{Timer: ms(15), Goroutine: ms(4), Thread: ms(4), Held: ms(5), Others: ms(8)}},
		// The sleep from 0 ended at 11, before the span.
		{12, 18, Delays{Goroutine: ms(4), Thread: ms(4), Held: ms(4), Others: ms(7)}},
		{0, 40, Delays{Timer: ms(15), Goroutine: ms(4), Thread: ms(4), Held: ms(8), Others: ms(8)}},
		{46, 48, Delays{}},
		{55, 60, Delays{Timer: ms(2)}},
	} {
		if got := p.During(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("step %d: During(%v, %v) = %+v, want %+v", i, tc.from, tc.to, got, tc.want)
		}
	}
	// A call from 22 for 3ms: looked at from 12, Timer 15 + the longer
	// of Goroutine 4 and Held 5 (thread 1, 2+3).
	if got, want := p.Excuse(at(22), 3*time.Millisecond), ms(20); got != want {
		t.Errorf("Excuse(22, 3ms) = %v, want %v", got, want)
	}
	// The same span at once: Timer 15 + the longer of Goroutine 4 and
	// Thread 4.
	if got, want := p.Stall(at(12), at(25)), ms(19); got != want {
		t.Errorf("Stall(12, 25) = %v, want %v", got, want)
	}
	if got, want := p.Worst(), (Delays{Timer: ms(15), Goroutine: ms(4), Thread: ms(4), Held: ms(8), Others: ms(8)}); got != want {
		t.Errorf("Worst() = %+v, want %+v", got, want)
	}
}

func TestReadWaits(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("schedstat is Linux's")
	}
	own, others := readWaits(nil, nil, []int{os.Getpid(), 0})
	if len(own) == 0 {
		t.Error("read no thread of the process")
	}
	if _, ok := others[os.Getpid()]; !ok || len(others) != 1 {
		t.Errorf("read %v for the processes %d and 0, want only %d", others, os.Getpid(), os.Getpid())
	}
}

// TestStartEnd runs a probe until it has a sample of each kind and ends
// it, twice; what the samples read is the machine's, and not checked.
func TestStartEnd(t *testing.T) {
	t.Parallel()
	p := Start(Options{Sleep: 3 * time.Millisecond, PIDs: []int{os.Getpid()}})
	sampled := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.sleeps) > 0 && len(p.runq) > 0 && len(p.waits) > 0
	}
	for deadline := time.Now().Add(time.Minute); !sampled(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no sample of each kind within a minute")
		}
	}
	p.End()
	p.End()
	if w := p.Worst(); w.Timer < 0 || w.Goroutine < 0 || w.Thread < 0 || w.Held < w.Thread || w.Others < 0 {
		t.Errorf("Worst() = %+v", w)
	}
}

func TestStartRejectsShortSleep(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("Start with a Sleep under a millisecond did not panic")
		}
	}()
	Start(Options{Sleep: time.Microsecond})
}
