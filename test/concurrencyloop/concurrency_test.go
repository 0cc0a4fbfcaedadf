// Package concurrencyloop runs concurrency rules end to end: real
// floodgate-sidecar processes sharing a real Redis Cluster in front of one
// application, over real sockets.
package concurrencyloop

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/test/redistest"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

var sidecarBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "concurrencyloop")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sidecarBin, err = simnode.BuildSidecar(context.Background(), filepath.Join("..", ".."), dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const (
	maxInFlight = 10
	leaseTTL    = 2 * time.Second
	sidecars    = 4
)

var policy = fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: exports
  uid: exports-1
  replicas: %d
  rules:
  - name: per-tenant
    key: [{header: X-Tenant}]
    concurrency: {max: %d, leaseTTL: %s}
`, sidecars, maxInFlight, leaseTTL)

// app is the application: its /slow requests wait until the test opens
// gate (closes it), then take hold, or wait until their client goes when
// hold is 0; it counts the requests in flight, and a sampler records the
// most it saw in any millisecond.
type app struct {
	srv      *http.Server
	url      string
	gate     chan struct{}
	hold     atomic.Int64 // nanoseconds
	inFlight atomic.Int64
	peak     atomic.Int64 // the most in flight at any entry
	sampled  atomic.Int64 // the most in flight in a 1ms sample
	served   atomic.Int64
}

func startApp(t *testing.T) *app {
	t.Helper()
	a := &app{gate: make(chan struct{})}
	b, err := simnode.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	a.url = "http://" + b
	a.srv = &http.Server{Addr: b, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			return // the readiness probe
		}
		n := a.inFlight.Add(1)
		for p := a.peak.Load(); n > p && !a.peak.CompareAndSwap(p, n); p = a.peak.Load() {
		}
		defer a.inFlight.Add(-1)
		select {
		case <-a.gate:
		case <-r.Context().Done():
			return
		}
		if d := time.Duration(a.hold.Load()); d > 0 {
			time.Sleep(d)
		} else {
			<-r.Context().Done()
			return
		}
		a.served.Add(1)
		_, _ = w.Write([]byte("done"))
	})}
	go func() { _ = a.srv.ListenAndServe() }()
	stop := make(chan struct{})
	go func() {
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				n := a.inFlight.Load()
				for p := a.sampled.Load(); n > p && !a.sampled.CompareAndSwap(p, n); p = a.sampled.Load() {
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		_ = a.srv.Close()
	})
	if err := simnode.Poll(context.Background(), 10*time.Millisecond, 10*time.Second, "the application", func() (bool, error) {
		res, err := http.Head(a.url + "/ping")
		if err == nil {
			_ = res.Body.Close()
		}
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	return a
}

func startSidecars(t *testing.T, upstream string, redisAddrs []string) []*simnode.Standalone {
	t.Helper()
	var out []*simnode.Standalone
	for i := range sidecars {
		dir := t.TempDir()
		file := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		// A Redis call budget the busiest test machine meets: a call that
		// runs out of the default 50ms answers 503, and may still take its
		// slot in Redis, for a lease TTL. What the sidecars do when Redis
		// is slow or gone is test/failopen's and test/faults'; here the
		// store answers.
		s, err := simnode.StartStandalone(context.Background(), sidecarBin, dir, "--policy-file", file, "--store", "redis",
			"--redis-addrs", strings.Join(redisAddrs, ","), "--redis-timeout", "10s", "--upstream", upstream)
		if err != nil {
			t.Fatalf("sidecar %d: %v", i, err)
		}
		t.Cleanup(func() { s.Stop(5 * time.Second) })
		out = append(out, s)
	}
	return out
}

func get(ctx context.Context, c *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/slow", nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Tenant", "acme")
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	_ = res.Body.Close()
	return res.StatusCode, res.Header.Get("Retry-After"), nil
}

// Four sidecars on one Redis Cluster with max 10 on one key take 200
// concurrent slow requests: the application never sees more than 10 of
// them at once, sampled every millisecond, and uses all 10; the others are
// answered 429 with Retry-After. Then a sidecar is SIGKILLed while its
// requests hold every slot, and the slots come back within the lease TTL.
func TestFourSidecarsShareTheCapAndACrashedOnesSlotsComeBack(t *testing.T) {
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	a := startApp(t)
	scs := startSidecars(t, a.url, cluster.Addrs())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}

	// The application holds the first requests it admits until the test
	// opens its gate: once ten are in and one has been refused, the cap
	// has been used in full and enforced, however the 200 arrive. Then
	// each request takes 100ms, and slots are given back and taken again.
	a.hold.Store(int64(100 * time.Millisecond))
	var wg sync.WaitGroup
	var ok, denied, other atomic.Int64
	var badRetry atomic.Value
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, retry, err := get(context.Background(), client, scs[i%sidecars].URL)
			switch {
			case err != nil:
				other.Add(1)
			case code == http.StatusOK:
				ok.Add(1)
			case code == http.StatusTooManyRequests:
				denied.Add(1)
				if retry != "1" {
					badRetry.Store(retry)
				}
			default:
				other.Add(1)
			}
		}()
	}
	full := simnode.Poll(context.Background(), 5*time.Millisecond, 60*time.Second, "ten requests in the application and one refused", func() (bool, error) {
		return a.inFlight.Load() >= maxInFlight && denied.Load() > 0, nil
	})
	close(a.gate)
	wg.Wait()
	if full != nil {
		t.Fatalf("%v: %d in the application, %d refused, %d otherwise", full, a.inFlight.Load(), denied.Load(), other.Load())
	}
	t.Logf("200 concurrent requests: %d answered 200, %d answered 429, %d otherwise; the application saw at most %d at once (%d in 1ms samples)",
		ok.Load(), denied.Load(), other.Load(), a.peak.Load(), a.sampled.Load())
	if got := a.peak.Load(); got != maxInFlight {
		t.Errorf("the application saw at most %d requests of the key at once, want %d: all of the cap, and no more", got, maxInFlight)
	}
	if got := a.sampled.Load(); got > maxInFlight {
		t.Errorf("a 1ms sample saw %d requests of the key at once, want at most %d", got, maxInFlight)
	}
	if ok.Load()+denied.Load() != 200 || other.Load() != 0 {
		t.Errorf("%d answered 200 and %d 429, %d otherwise; want 200 answers of 200 or 429", ok.Load(), denied.Load(), other.Load())
	}
	if ok.Load() < maxInFlight || denied.Load() == 0 {
		t.Errorf("%d admitted and %d refused, want at least %d admitted and some refused", ok.Load(), denied.Load(), maxInFlight)
	}
	if r := badRetry.Load(); r != nil {
		t.Errorf("a 429 had Retry-After %q, want 1", r)
	}
	if got := a.served.Load(); got != ok.Load() {
		t.Errorf("the application served %d, the clients got %d answers 200", got, ok.Load())
	}

	// Sidecar 0's requests take every slot and wait. A slot of the run
	// above may not be back yet (a sidecar gives it back to Redis after
	// its answer has gone): a request refused for it asks again.
	a.hold.Store(0)
	a.peak.Store(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range maxInFlight {
		go func() {
			for {
				if code, _, err := get(ctx, client, scs[0].URL); err != nil || code != http.StatusTooManyRequests {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
	}
	if err := simnode.Poll(ctx, 5*time.Millisecond, 30*time.Second, "10 requests in flight", func() (bool, error) {
		return a.inFlight.Load() == maxInFlight, nil
	}); err != nil {
		t.Fatal(err)
	}
	if code, _, err := get(context.Background(), client, scs[1].URL); err != nil || code != http.StatusTooManyRequests {
		t.Fatalf("with every slot held through sidecar 0, sidecar 1 answered %d (%v), want 429", code, err)
	}
	if err := syscall.Kill(scs[0].Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-scs[0].Done()
	// The dead sidecar never releases its slots: they come back when their
	// leases expire, in Redis, a lease TTL after their last renewal, by
	// Redis's clock, which the acquire script reads to drop them. That
	// renewal was before the kill, or in flight then: Redis has run every
	// call the sidecar sent before it died when it answers a read sent
	// after its exit, so no lease of the first such read expires more than
	// a lease TTL after that read (measured from the kill: the TTL plus
	// however long the machine took to let the test read).
	rdb := cluster.NewClient()
	defer func() { _ = rdb.Close() }()
	key := leaseKey(t, rdb)
	first := readLeases(t, rdb, key)
	held := first.live()
	if len(held) == 0 {
		t.Fatalf("%s holds no live lease after sidecar 0 was killed holding every slot: %v", key, first.expires)
	}
	var last time.Time
	for id, exp := range held {
		if limit := first.now.Add(leaseTTL); exp.After(limit) {
			t.Errorf("sidecar 0's lease %s expires %v after the kill: more than the lease TTL %s after Redis read it, %v after the kill, when any renewal of it had run",
				id, exp.Sub(killed).Round(time.Millisecond), leaseTTL, first.now.Sub(killed).Round(time.Millisecond))
		}
		if exp.After(last) {
			last = exp
		}
	}
	// Wait on Redis until they have expired by its clock. The timeout only
	// bounds a hang: Redis's clock passes the last expiry on its own.
	var expired leases
	if err := simnode.Poll(context.Background(), 10*time.Millisecond, time.Until(last)+30*time.Second, "sidecar 0's leases expired in Redis", func() (bool, error) {
		l, err := tryReadLeases(context.Background(), rdb, key)
		if err != nil {
			return false, nil //nolint:nilerr // a read that failed: read again
		}
		expired = l
		return len(l.live()) == 0, nil
	}); err != nil {
		t.Fatalf("%v: Redis's clock at %v after the kill, its live leases %v", err, expired.now.Sub(killed).Round(time.Millisecond), expired.live())
	}
	// From then on all ten are free, so ten concurrent requests through
	// the live sidecars, the first since the kill, are all admitted. (No
	// request is admitted before them: a live sidecar gives a slot back
	// after its answer has gone, and a next request could find it still
	// taken.)
	a.hold.Store(int64(200 * time.Millisecond))
	var admitted atomic.Int64
	var wg2 sync.WaitGroup
	for i := range maxInFlight {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			if code, _, err := get(context.Background(), client, scs[1+i%(sidecars-1)].URL); err == nil && code == http.StatusOK {
				admitted.Add(1)
			}
		}()
	}
	wg2.Wait()
	t.Logf("sidecar 0 held %d leases, read %v after SIGKILL, the last expiring %v after it (lease TTL %s), and expired by Redis's clock %v after it; then %d of %d concurrent requests admitted",
		len(held), first.now.Sub(killed).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond), leaseTTL, expired.now.Sub(killed).Round(time.Millisecond), admitted.Load(), maxInFlight)
	if got := admitted.Load(); got != maxInFlight {
		t.Errorf("once sidecar 0's leases had expired in Redis (%v after it was killed), %d of %d concurrent requests were admitted, want all: its slots come back within the lease TTL %s",
			expired.now.Sub(killed).Round(time.Millisecond), got, maxInFlight, leaseTTL)
	}
}

// leaseKey returns the key of the concurrency leases in the cluster: the
// one key redislayout.SlotKey names, fg:{<tag>}:cc:1, that the test's
// requests, all of one tenant, take their slots on.
func leaseKey(t *testing.T, rdb *redis.ClusterClient) string {
	t.Helper()
	var keys []string
	if err := simnode.Poll(context.Background(), 10*time.Millisecond, 30*time.Second, "a scan of the cluster's lease keys", func() (bool, error) {
		var mu sync.Mutex
		keys = nil
		err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
			it := c.Scan(ctx, 0, "fg:*:cc:1", 100).Iterator()
			for it.Next(ctx) {
				mu.Lock()
				keys = append(keys, it.Val())
				mu.Unlock()
			}
			return it.Err()
		})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("the cluster holds lease keys %v, want one: the key of tenant acme's slots", keys)
	}
	return keys[0]
}

// leases is what a lease key held at an instant of Redis's clock.
type leases struct {
	// now is Redis's clock when it was read.
	now time.Time
	// expires holds when each lease, by id, expires.
	expires map[string]time.Time
}

// live returns the leases that have not expired at l.now: those the
// acquire script, which drops every lease whose expiry is at or before its
// now, would keep.
func (l leases) live() map[string]time.Time {
	out := map[string]time.Time{}
	for id, exp := range l.expires {
		if exp.After(l.now) {
			out[id] = exp
		}
	}
	return out
}

// leasesScript reads a lease key (concurrency_acquire.lua: members are
// lease ids, scores their expiry in microseconds since the epoch) and
// Redis's clock at once.
var leasesScript = redis.NewScript(`local t = redis.call('TIME')
return {t[1] .. string.format('%06d', tonumber(t[2])), redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}`)

func readLeases(t *testing.T, rdb *redis.ClusterClient, key string) leases {
	t.Helper()
	var l leases
	if err := simnode.Poll(context.Background(), 10*time.Millisecond, 30*time.Second, "a read of "+key, func() (bool, error) {
		var err error
		l, err = tryReadLeases(context.Background(), rdb, key)
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

func tryReadLeases(ctx context.Context, rdb *redis.ClusterClient, key string) (leases, error) {
	res, err := leasesScript.Run(ctx, rdb, []string{key}).Slice()
	if err != nil {
		return leases{}, err
	}
	if len(res) != 2 {
		return leases{}, fmt.Errorf("reading %s: reply %v, want Redis's clock and the leases", key, res)
	}
	now, err := micros(res[0])
	if err != nil {
		return leases{}, err
	}
	flat, ok := res[1].([]any)
	if !ok || len(flat)%2 != 0 {
		return leases{}, fmt.Errorf("reading %s: leases %v, want ids and expiries", key, res[1])
	}
	l := leases{now: now, expires: map[string]time.Time{}}
	for i := 0; i < len(flat); i += 2 {
		id, ok := flat[i].(string)
		if !ok {
			return leases{}, fmt.Errorf("reading %s: lease id %v", key, flat[i])
		}
		exp, err := micros(flat[i+1])
		if err != nil {
			return leases{}, err
		}
		l.expires[id] = exp
	}
	return l, nil
}

// micros reads a count of microseconds since the epoch, as Redis returns
// it: a decimal string (a sorted set's score, formatted as a double).
func micros(v any) (time.Time, error) {
	s, ok := v.(string)
	if !ok {
		return time.Time{}, fmt.Errorf("%v (%T) is no count of microseconds", v, v)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is no count of microseconds: %w", s, err)
	}
	return time.UnixMicro(int64(f)), nil
}
