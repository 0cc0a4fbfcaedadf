package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseClusterNodes(t *testing.T) {
	t.Parallel()
	const reply = `07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host.example slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master,fail - 0 1426238318243 3 disconnected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 10923 [10924->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
`
	nodes, err := parseClusterNodes(reply)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(nodes), 4; got != want {
		t.Fatalf("len = %d, want %d", got, want)
	}
	if got, want := nodes[0].Addr, "127.0.0.1:30004"; got != want {
		t.Errorf("addr = %q, want %q", got, want)
	}
	if got, want := nodes[0].MasterID, "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"; got != want {
		t.Errorf("master id = %q, want %q", got, want)
	}
	if nodes[0].IsMaster() || !nodes[1].IsMaster() {
		t.Errorf("IsMaster: replica %v, master %v", nodes[0].IsMaster(), nodes[1].IsMaster())
	}
	if !nodes[2].Failing() || nodes[2].Connected {
		t.Errorf("failed node: Failing=%v Connected=%v", nodes[2].Failing(), nodes[2].Connected)
	}
	if got, want := nodes[3].Slots, []SlotRange{{0, 5460}, {10923, 10923}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("slots = %v, want %v", got, want)
	}
	if !nodes[3].Owns(10923) || nodes[3].Owns(10924) {
		t.Errorf("Owns(10923)=%v Owns(10924)=%v, want true false", nodes[3].Owns(10923), nodes[3].Owns(10924))
	}
	if _, err := parseClusterNodes("abc 127.0.0.1:1 master"); err == nil {
		t.Error("short line parsed without error")
	}
	if _, err := parseClusterNodes("a 127.0.0.1:1@2 master - 0 0 1 connected 9-3"); err == nil {
		t.Error("inverted slot range parsed without error")
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	o := Options{Masters: 17, Replicas: -1, NodeTimeout: time.Millisecond}
	err := o.setDefaults()
	if err == nil {
		t.Fatal("setDefaults accepted bad options")
	}
	for _, want := range []string{"masters", "replicas", "nodeTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestClusterForms(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 3, Replicas: 1})
	ctx := t.Context()
	if got, want := len(c.Addrs()), 6; got != want {
		t.Fatalf("len(Addrs) = %d, want %d", got, want)
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(masters), 3; got != want {
		t.Fatalf("len(Masters) = %d, want %d", got, want)
	}
	for _, m := range masters {
		reps, err := c.ReplicasOf(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) != 1 {
			t.Errorf("master %v has %d replicas, want 1", m, len(reps))
		}
	}
	cl := c.NewClient()
	defer func() { _ = cl.Close() }()
	for i := range 50 {
		key := "k" + strconv.Itoa(i)
		if err := cl.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
		owner, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		n, err := owner.Client().Exists(ctx, key).Result()
		if err != nil || n != 1 {
			t.Fatalf("exists %s on its master %v = %d, %v; want 1", key, owner, n, err)
		}
	}
}

func TestKillFailoverRestart(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	ctx := t.Context()
	old, err := c.MasterForKey(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(ctx, old)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %v: %v, %v", old, reps, err)
	}
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	if old.Running() || old.Pid() != 0 {
		t.Fatalf("killed node still running")
	}
	promoted, err := c.WaitForFailover(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if promoted != reps[0] {
		t.Errorf("promoted %v, want the replica %v", promoted, reps[0])
	}
	if err := c.WaitClusterOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitClusterOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	reps, err = c.ReplicasOf(ctx, promoted)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 || reps[0] != old {
		t.Errorf("after restart, replicas of %v = %v, want the old master %v", promoted, reps, old)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 3, NodeTimeout: 5 * time.Second})
	n := c.Nodes()[0]
	if err := c.Pause(n); err != nil {
		t.Fatal(err)
	}
	if !n.Paused() {
		t.Fatal("Paused() = false after Pause")
	}
	cl := redis.NewClient(&redis.Options{Addr: n.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer func() { _ = cl.Close() }()
	start := time.Now()
	err := cl.Ping(t.Context()).Err()
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("ping to a paused node: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ping to a paused node took %v", d)
	}
	if err := c.Resume(n); err != nil {
		t.Fatal(err)
	}
	if err := n.Client().Ping(t.Context()).Err(); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
	if err := c.WaitClusterOK(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestRestartAtNewAddress(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 3, NodeTimeout: time.Second})
	ctx := t.Context()
	n := c.Nodes()[1]
	oldAddr := n.Addr()
	cl := c.NewClient()
	defer func() { _ = cl.Close() }()
	slot := 8000 // in the middle master's range
	key := keyInSlot(t, c, slot)
	if owner, err := c.MasterForSlot(ctx, slot); err != nil || owner != n {
		t.Fatalf("slot %d owner = %v, %v; want %v", slot, owner, err, n)
	}
	if err := c.Kill(n); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartAt(n, "127.0.0.2"); err != nil {
		t.Fatal(err)
	}
	if got := n.Addr(); got == oldAddr || !strings.HasPrefix(got, "127.0.0.2:") {
		t.Fatalf("Addr after RestartAt = %s (was %s), want 127.0.0.2:port", got, oldAddr)
	}
	if err := c.WaitClusterOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	view, err := c.Nodes()[0].view(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range view {
		if v.ID == n.ID() && v.Addr != n.Addr() {
			t.Errorf("peer sees %s at %s, want %s", n.ID(), v.Addr, n.Addr())
		}
	}
	// The cluster client follows the new address through MOVED or a slot
	// map reload.
	if err := cl.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("set after move: %v", err)
	}
	if got, err := n.Client().Exists(ctx, key).Result(); err != nil || got != 1 {
		t.Fatalf("key on moved node: %d, %v", got, err)
	}
	if err := c.RestartAt(n, "10.0.0.1"); err == nil {
		t.Error("RestartAt accepted a non-loopback host")
	}
}

// keyInSlot finds a key that hashes to slot.
func keyInSlot(t *testing.T, c *Cluster, slot int) string {
	t.Helper()
	cl := c.Nodes()[0].Client()
	keys, err := cl.ClusterGetKeysInSlot(t.Context(), slot, 1).Result()
	if err == nil && len(keys) == 1 {
		return keys[0]
	}
	for i := range 1 << 20 {
		k := "k" + strconv.Itoa(i)
		s, err := c.KeySlot(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if s == slot {
			return k
		}
	}
	t.Fatalf("no key for slot %d", slot)
	return ""
}

func TestServer(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{Password: "s3cret"})
	ctx := t.Context()
	if err := s.Client().Set(ctx, "a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer func() { _ = anon.Close() }()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("ping without password: %v, want NOAUTH", err)
	}
	pid := s.Pid()
	s.Kill()
	if s.Pid() != 0 || processExists(pid) {
		t.Fatal("killed server still running")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Client().Exists(ctx, "a").Result(); err != nil || got != 0 {
		t.Errorf("exists after restart = %d, %v; want 0 (nothing persisted)", got, err)
	}
}

func TestParallelClustersGetDistinctPorts(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	var clusters []*Cluster
	for range 3 {
		// Sequential starts in one test still go through the lock: three
		// clusters in one process must never share a port.
		c := StartCluster(t, Options{Masters: 1})
		clusters = append(clusters, c)
	}
	for _, c := range clusters {
		for _, a := range c.Addrs() {
			if seen[a] {
				t.Fatalf("address %s used twice", a)
			}
			seen[a] = true
		}
	}
}

func processExists(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie still has /proc/<pid>; it no longer runs.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestNoOrphans runs this test binary as a child that starts a cluster and
// a server, kills the child the way a user or go test would, and checks
// that every redis-server it started is gone.
func TestNoOrphans(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.timeout=60s")
			cmd.Env = append(os.Environ(), "REDISTEST_ORPHAN_CHILD=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			var pids []int
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				if rest, ok := strings.CutPrefix(line, "PIDS "); ok {
					for f := range strings.FieldsSeq(rest) {
						p, err := strconv.Atoi(f)
						if err != nil {
							t.Fatalf("bad pid line %q", line)
						}
						pids = append(pids, p)
					}
					break
				}
			}
			if len(pids) != 2 {
				t.Fatalf("child reported pids %v, want 2", pids)
			}
			for _, p := range pids {
				if !processExists(p) {
					t.Fatalf("redis-server %d not running before the kill", p)
				}
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait() // the child dies by our signal
			deadline := time.Now().Add(5 * time.Second)
			for _, p := range pids {
				for processExists(p) {
					if time.Now().After(deadline) {
						t.Fatalf("redis-server %d outlived its test process (%v)", p, sig)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}

// orphanChild is the child half of TestNoOrphans: it starts a cluster and
// a server without any teardown of its own, reports their pids and waits
// to be killed.
func orphanChild() {
	c, err := NewCluster(Options{Masters: 1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := NewServer(ServerOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("PIDS %d %d\n", c.Nodes()[0].Pid(), s.Pid())
	time.Sleep(50 * time.Second)
	os.Exit(3) // the parent kills us long before this
}

func TestMain(m *testing.M) {
	if os.Getenv("REDISTEST_ORPHAN_CHILD") == "1" {
		orphanChild()
	}
	os.Exit(m.Run())
}
