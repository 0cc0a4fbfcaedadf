// Package failopen checks, with real sidecars in front of a real backend
// and a real Redis Cluster that is then killed, that a fleet of sidecars
// falling back to their local shares admits at most the rule's limit
// together (1.1 x L at most per period), for every limit and replica
// count, including a limit below the replica count; and, with
// floodgate-sidecar processes whose store refuses connections, that a
// standalone sidecar without a share of its own (no --pod-name, or a name
// the policy's replicaPods does not list) refuses to start.
package failopen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/redistest"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

type fleetCase struct {
	name     string
	requests int64
	per      time.Duration
	replicas int
	// run is how long traffic is offered after the kill; workers send
	// requests round robin over the sidecars, each pausing pace between
	// two requests.
	run     time.Duration
	workers int
	pace    time.Duration
}

func TestFleetHoldsTheLimitWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []fleetCase{
		{name: "3 per minute on 10 replicas", requests: 3, per: time.Minute, replicas: 10, run: 150 * time.Second, workers: 1, pace: 100 * time.Millisecond},
		{name: "1000 per second on 3 replicas", requests: 1000, per: time.Second, replicas: 3, run: 5 * time.Second, workers: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runFleet(t, tc)
		})
	}
}

func runFleet(t *testing.T, tc fleetCase) {
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 1})
	var backendHits atomic.Int64
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		backendHits.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)

	// One document for the fleet: the replicas listed by pod name, as
	// floodgate-manager writes them.
	var pods, idx []string
	for i := range tc.replicas {
		pods = append(pods, fmt.Sprintf("%q", fmt.Sprintf("api-%d", i)))
		idx = append(idx, fmt.Sprint(i))
	}
	doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
pods: [%s]
policies:
- name: login
  uid: fleet
  replicas: %d
  replicaPods: [%s]
  rules:
  - name: per-user
    key: [{header: X-User}]
    failureMode: Open
    limit: {requests: %d, per: %v}
`, strings.Join(pods, ", "), tc.replicas, strings.Join(idx, ", "), tc.requests, tc.per)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range tc.replicas {
		urls = append(urls, startSidecar(t, policy, be.URL, fmt.Sprintf("api-%d", i), cluster.Addrs()))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	send := func(url string) int {
		req, err := http.NewRequest(http.MethodGet, url+"/login", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", "alice")
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("request: %v", err)
			return 0
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode
	}
	// With the store up, every sidecar decides on it.
	for _, u := range urls {
		if got := send(u); got != http.StatusOK && got != http.StatusTooManyRequests {
			t.Fatalf("with the store up: %d", got)
		}
	}
	var wg sync.WaitGroup
	for _, n := range cluster.Nodes() {
		wg.Go(func() {
			if err := cluster.Kill(n); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	killed := time.Now()
	hits0 := backendHits.Load()

	var mu sync.Mutex
	var admitted []time.Duration
	var offered atomic.Int64
	var next atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), tc.run)
	defer cancel()
	for range tc.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				u := urls[int(next.Add(1))%len(urls)]
				offered.Add(1)
				switch send(u) {
				case http.StatusOK:
					at := time.Since(killed)
					mu.Lock()
					admitted = append(admitted, at)
					mu.Unlock()
				case http.StatusTooManyRequests:
				default:
					t.Errorf("a request while the store is down got neither 200 nor 429")
				}
				if tc.pace > 0 {
					time.Sleep(tc.pace)
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(admitted)

	// The most admitted in any window of one period, and per period from
	// the kill.
	worst := 0
	for i, j := 0, 0; i < len(admitted); i++ {
		for j < len(admitted) && admitted[j] < admitted[i]+tc.per {
			j++
		}
		worst = max(worst, j-i)
	}
	periods := int(tc.run / tc.per)
	perPeriod := make([]int, periods)
	for _, a := range admitted {
		if p := int(a / tc.per); p < periods {
			perPeriod[p]++
		}
	}
	limit := float64(tc.requests) * 1.1
	t.Logf("L=%d per %v, R=%d, Redis killed, %v of traffic: %d requests offered, %d admitted (backend saw %d); per period from the kill: %v (bound 1.1 x L = %.1f); most in any sliding %v window: %d",
		tc.requests, tc.per, tc.replicas, tc.run, offered.Load(), len(admitted), backendHits.Load()-hits0, perPeriod, limit, tc.per, worst)
	for p, n := range perPeriod {
		if float64(n) > limit {
			t.Errorf("period %d after the kill: the fleet admitted %d, more than 1.1 x the limit %d", p, n, tc.requests)
		}
	}
	// A sliding window may also hold tokens a replica had not spent yet,
	// as one bucket of the whole limit may after a pause: at most its
	// capacity (here the limit) more.
	if int64(worst) > 2*tc.requests {
		t.Errorf("a sliding window of one period admitted %d, more than one bucket of the limit could (%d)", worst, 2*tc.requests)
	}
	if got := backendHits.Load() - hits0; got != int64(len(admitted)) {
		t.Errorf("the backend saw %d requests, the clients %d admitted", got, len(admitted))
	}
	// The shares must not starve the fleet either: over the run, the
	// fleet admits close to the limit's rate (the key starts empty on
	// every sidecar, so the first token comes one spacing in).
	want := float64(tc.requests) * float64(tc.run) / float64(tc.per)
	if float64(len(admitted)) < 0.8*want-1 {
		t.Errorf("the fleet admitted %d over %v, want about %.0f (the limit's rate)", len(admitted), tc.run, want)
	}
}

// startSidecar runs floodgate-sidecar for pod name on policy, in front of
// upstream, with the Redis Cluster at addrs; it returns the proxy's URL.
func startSidecar(t *testing.T, policy, upstream, name string, addrs []string) string {
	t.Helper()
	return simnode.RunInProcess(t, "--upstream", upstream, "--policy-file", policy, "--pod-name", name,
		"--store", "redis", "--redis-addrs", strings.Join(addrs, ","), "--redis-timeout", "1s")
}
