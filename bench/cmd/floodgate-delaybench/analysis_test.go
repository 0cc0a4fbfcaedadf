package main

import (
	"slices"
	"testing"
	"time"
)

func TestPerSecond(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ts := []time.Time{
		t0.Add(-time.Millisecond), // before t0: second 0
		t0,
		t0.Add(999 * time.Millisecond),
		t0.Add(time.Second), // the boundary opens second 1
		t0.Add(3*time.Second + 1),
	}
	got := perSecond(t0, ts)
	if want := []int{3, 1, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("perSecond = %v, want %v", got, want)
	}
	if got := perSecond(t0, nil); len(got) != 0 {
		t.Fatalf("perSecond of nothing = %v", got)
	}
}

func TestCheckRate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		counts   []int
		from, to int
		pass     bool
		outside  []int
		min, max int
	}{
		{"the band's edges pass", []int{250, 98, 102, 100}, 1, 3, true, nil, 98, 102},
		{"the first second is not checked", []int{0, 100, 100}, 1, 2, true, nil, 100, 100},
		{"one short", []int{100, 97, 100, 103}, 1, 3, false, []int{1, 3}, 97, 103},
		{"a missing second counts 0", []int{100, 100}, 1, 2, false, []int{2}, 0, 100},
		{"an empty range fails", []int{100}, 1, 0, false, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := checkRate(tc.counts, tc.from, tc.to, 100, 0.02)
			if b.Pass != tc.pass || !slices.Equal(b.Outside, append([]int{}, tc.outside...)) || b.Min != tc.min || b.Max != tc.max {
				t.Fatalf("checkRate(%v, %d, %d) = %+v", tc.counts, tc.from, tc.to, b)
			}
		})
	}
}

func TestDist(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	d := dist(ds)
	if d.N != 100 || d.P50 != 50 || d.P90 != 90 || d.P99 != 99 || d.Max != 100 {
		t.Fatalf("dist = %+v", d)
	}
	if ds[0] != 100*time.Millisecond {
		t.Fatal("dist sorted its argument")
	}
	if (dist(nil) != Dist{}) {
		t.Fatal("dist of nothing is not zero")
	}
}

func TestParseArrivals(t *testing.T) {
	as, err := parseArrivals("3 1000000000 DELAYED\n\n7 2000000000\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 2 || as[0].ID != 3 || as[0].Mark != "DELAYED" || !as[1].At.Equal(time.Unix(2, 0)) || as[1].Mark != "" {
		t.Fatalf("parseArrivals = %+v", as)
	}
	if _, err := parseArrivals("x 1\n"); err == nil {
		t.Fatal("a bad line parsed")
	}
}

func TestClassify(t *testing.T) {
	t0 := time.Unix(1000, 0)
	recs := []outcome{
		{Due: t0, Done: t0.Add(time.Millisecond), Status: 200},                                       // 0: immediate
		{Due: t0, Sent: t0.Add(time.Millisecond), Done: t0.Add(500 * time.Millisecond), Status: 200}, // 1: delayed
		{Due: t0, Done: t0.Add(time.Millisecond), Status: 429},                                       // 2: refused
		{Due: t0, Status: 0}, // 3: error
		{},                   // 4: never sent
		{Due: t0, Done: t0.Add(time.Millisecond), Status: 200},                                             // 5: no arrival
		{Due: t0.Add(time.Second), Done: t0.Add(2 * time.Second), Status: 204},                             // 6: delayed by mark
		{Due: t0, Sent: t0.Add(300 * time.Millisecond), Done: t0.Add(302 * time.Millisecond), Status: 200}, // 7: sent late, not delayed
	}
	arr := []arrival{
		{ID: 0, At: t0.Add(time.Millisecond / 2), Mark: "PASSED"},
		{ID: 1, At: t0.Add(499 * time.Millisecond)},
		{ID: 6, At: t0.Add(time.Second + time.Millisecond), Mark: "DELAYED"},
		{ID: 7, At: t0.Add(301 * time.Millisecond)},
	}
	delayed := func(mark string, d time.Duration) bool { return mark == "DELAYED" || d > 100*time.Millisecond }
	c, delays, held, lats, times := classify(recs, arr, delayed)
	want := Counts{Sent: 7, OK: 5, Delayed: 2, Immediate: 2, Refused: 1, Errors: 1, Unmatched: 1, Arrivals: 4}
	if c != want {
		t.Fatalf("counts = %+v, want %+v", c, want)
	}
	if !slices.Equal(delays, []time.Duration{499 * time.Millisecond, time.Millisecond}) {
		t.Fatalf("delays = %v", delays)
	}
	if !slices.Equal(held, []time.Duration{498 * time.Millisecond}) {
		t.Fatalf("held = %v (from the actual send, where there is one)", held)
	}
	if len(lats) != 5 || len(times) != 4 {
		t.Fatalf("%d latencies, %d arrival times", len(lats), len(times))
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := parseVmRSS("Name:\tfloodgate-sidecar\nVmPeak:\t  9 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n")
	if err != nil || got != 12345<<10 {
		t.Fatalf("parseVmRSS = %d, %v", got, err)
	}
	if _, err := parseVmRSS("Name: x\n"); err == nil {
		t.Fatal("no VmRSS parsed")
	}
}
