package memstore_test

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// Sweep gives back the memory of the keys it removes: once the keys of a
// flood (or of rules a config no longer has) have expired, a sweep
// shrinks the tables and frees the SlidingLog buffers, and the store is
// back to the size of an empty one but for the keys still counting,
// which keep their counts.
func TestSweepGivesBackTheHeap(t *testing.T) {
	// Not parallel: it reads the heap.
	clk := limitertest.NewClock(time.Unix(1_700_000_000, 0))
	s := newStore(t, memstore.WithClock(clk.Now))
	short := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Second}
	logged := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 3, Period: time.Second}
	long := limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Hour}
	take(t, s, "warm", long, 1)
	var empty, full, swept runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&empty)

	const keys = 100_000
	for i := range keys {
		k := strconv.Itoa(i)
		take(t, s, "tb:"+k, short, 1)
		take(t, s, "log:"+k, logged, 1)
		clk.Add(time.Microsecond) // a run of its own in each log
		take(t, s, "log:"+k, logged, 1)
	}
	take(t, s, "stays", long, 2)
	runtime.GC()
	runtime.ReadMemStats(&full)

	clk.Add(time.Minute)
	if got := s.Sweep(time.Time{}); got != 2*keys {
		t.Fatalf("Sweep removed %d keys, want %d", got, 2*keys)
	}
	runtime.GC()
	runtime.ReadMemStats(&swept)
	t.Logf("heap: %d bytes empty, %d with %d keys, %d swept", empty.HeapAlloc, full.HeapAlloc, 2*keys+1, swept.HeapAlloc)
	// A few shards hold a key that stays, in a table of 8 slots.
	if grew := int64(swept.HeapAlloc) - int64(empty.HeapAlloc); grew > 32<<10 {
		t.Errorf("after the sweep the store holds %d bytes more than with its first key; want at most %d", grew, 32<<10)
	}
	if got := s.Len(); got != 2 {
		t.Errorf("Len = %d, want the 2 keys of the hour-long limit", got)
	}
	if d := take(t, s, "stays", long, 1); !d.Allowed || d.Remaining != 0 {
		t.Errorf("a key that stayed through the sweep: %+v, want its last request allowed (3 - 2 - 1)", d)
	}
	// The store still grows when keys come back.
	for i := range 1000 {
		take(t, s, "again:"+strconv.Itoa(i), logged, 1)
	}
	if got := s.Len(); got != 1002 {
		t.Errorf("Len = %d, want 1002", got)
	}
}
