package redisstore_test

import (
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// cluster is the package's shared cluster: 3 masters, 3 replicas. Tests
// that inject faults start their own.
var cluster *redistest.Cluster

func TestMain(m *testing.M) {
	redistest.Main(m, redistest.Options{Masters: 3, Replicas: 1}, func(c *redistest.Cluster) { cluster = c })
}

// at returns a clock that reads t, for Options.Now.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// newStore returns a store on c, closed at the end of the test.
func newStore(t testing.TB, c *redistest.Cluster, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	opts.Addrs = c.Addrs()
	opts.Password = c.Password()
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// suiteTimeout is the per-call deadline for the conformance suite. The
// suite checks decisions, not latency, and its race subtests put 1000
// callers on one key at once, five algorithms at a time, on a small shared
// machine: under the default 50ms deadline the last of them would time out
// in the queue. The deadline itself is tested in the fault tests.
const suiteTimeout = 5 * time.Second

func TestConformance(t *testing.T) {
	t.Parallel()
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store {
		return newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: now})
	})
}

// TestConformanceNoWindow runs the suite with no batch window, where the
// writer never waits for an answer before it writes.
func TestConformanceNoWindow(t *testing.T) {
	t.Parallel()
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store {
		return newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout, BatchWindow: 0, Now: now})
	})
}

func TestConformanceSingleNode(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "pw"})
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store {
		s, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{srv.Addr()}, Single: true, Password: "pw", Timeout: suiteTimeout, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
