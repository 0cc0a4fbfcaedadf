package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	o := Options{Masters: 17, Replicas: -1, NodeTimeout: time.Millisecond, Port: 7000}
	err := o.setDefaults()
	if err == nil {
		t.Fatal("setDefaults accepted bad options")
	}
	for _, want := range []string{"masters", "replicas", "nodeTimeout", "port: only with ipPerNode"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	o = Options{IPPerNode: true, Port: 60000}
	if err := o.setDefaults(); err == nil || !strings.Contains(err.Error(), "port: must be between 1 and 55535") {
		t.Errorf("a port whose bus port is out of range: %v, want an error naming port", err)
	}
	o = Options{IPPerNode: true}
	if err := o.setDefaults(); err != nil || o.Port != DefaultPort {
		t.Errorf("IPPerNode alone: port %d, %v; want %d and no error", o.Port, err, DefaultPort)
	}

	so := ServerOptions{Host: "127.1.0.1", Command: []string{"true"}, ExtraArgs: []string{"--x"}}
	err = so.setDefaults()
	if err == nil {
		t.Fatal("setDefaults accepted bad server options")
	}
	for _, want := range []string{"host \"127.1.0.1\" and port 0", "extraArgs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	so = ServerOptions{Command: []string{"true"}}
	if err := so.setDefaults(); err == nil || !strings.Contains(err.Error(), "command: needs the host and port") {
		t.Errorf("a command without an address: %v, want an error naming command", err)
	}
}

// TestLoggedAt reads the last matching line of a node's redis.log, in
// local time, and names what it cannot find.
func TestLoggedAt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const log = `4242:M 05 Dec 2026 23:41:40.001 * Ready to accept connections tcp
4242:S 05 Dec 2026 23:41:41.500 # Failover election won: I'm the new master.
4242:M 05 Dec 2026 23:41:42.123 * Ready to accept connections tcp
4242:M 05 Dec 2026 23:41:43.000 * Cluster state changed: ok
4242:M no time here: broken
`
	if err := os.WriteFile(filepath.Join(dir, "redis.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &Node{proc: &process{dir: dir, host: "127.0.0.1", port: 12000}}
	for _, tc := range []struct {
		msg  string
		want time.Time
	}{
		{"Ready to accept connections", time.Date(2026, 12, 5, 23, 41, 42, 123e6, time.Local)},
		{promotionLine, time.Date(2026, 12, 5, 23, 41, 41, 500e6, time.Local)},
	} {
		if got, err := n.LoggedAt(tc.msg); err != nil || !got.Equal(tc.want) {
			t.Errorf("LoggedAt(%q) = %v, %v, want %v", tc.msg, got, err, tc.want)
		}
	}
	if got, err := n.PromotedAt(); err != nil || !got.Equal(time.Date(2026, 12, 5, 23, 41, 41, 500e6, time.Local)) {
		t.Errorf("PromotedAt() = %v, %v", got, err)
	}
	for _, msg := range []string{"never logged", "broken"} {
		if _, err := n.LoggedAt(msg); err == nil || !strings.Contains(err.Error(), "127.0.0.1:12000") {
			t.Errorf("LoggedAt(%q): %v, want an error naming the node", msg, err)
		}
	}
}

// TestIPPerNode forms a cluster whose nodes have loopback IPs of their
// own, on one port, and checks that the cluster knows them by those IPs.
func TestIPPerNode(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 3, IPPerNode: true})
	ctx := t.Context()
	ips := map[string]bool{}
	for _, n := range c.Nodes() {
		host, port, err := net.SplitHostPort(n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if ip := net.ParseIP(host).To4(); ip == nil || ip[0] != 127 || ip[1] != 1 || port != strconv.Itoa(DefaultPort) {
			t.Errorf("node at %s, want an IP of 127.1.0.0/16 and port %d", n.Addr(), DefaultPort)
		}
		ips[host] = true
	}
	if len(ips) != 3 {
		t.Errorf("3 nodes on %d IPs, want 3", len(ips))
	}
	view, err := c.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range view {
		if n := c.byID(v.ID); n == nil || n.Addr() != v.Addr {
			t.Errorf("the cluster knows %s at %s, want the node's own address", v.ID, v.Addr)
		}
	}
	cl := c.NewClient()
	defer func() { _ = cl.Close() }()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestUnformedAndReschedule starts nodes that no one has formed, adds one,
// and brings nodes back as Kubernetes would: at a new IP with their
// identity, and as new nodes at their address.
func TestUnformedAndReschedule(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 1, Replicas: 1, Unformed: true, IPPerNode: true, PartialCoverage: true})
	ctx := t.Context()
	added, err := c.AddNodes(1)
	if err != nil {
		t.Fatal(err)
	}
	nodes := c.Nodes()
	if len(added) != 1 || len(nodes) != 3 || nodes[2] != added[0] {
		t.Fatalf("AddNodes(1) = %v, Nodes() = %v; want the new node last of 3", added, nodes)
	}
	ids := map[string]bool{}
	for _, n := range nodes {
		view, err := n.view(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(view) != 1 || view[0].ID != n.ID() || len(view[0].Slots) != 0 {
			t.Errorf("node %v sees %+v, want itself alone, without slots", n, view)
		}
		ids[n.ID()] = true
	}
	if len(ids) != 3 {
		t.Errorf("3 nodes with %d distinct IDs", len(ids))
	}

	n := nodes[0]
	id, addr := n.ID(), n.Addr()
	if err := c.Reschedule(n, true, true); err == nil {
		t.Error("Reschedule of a running node succeeded")
	}
	if err := c.Kill(n); err != nil {
		t.Fatal(err)
	}
	if err := c.Reschedule(n, true, true); err != nil {
		t.Fatal(err)
	}
	if n.Addr() == addr {
		t.Errorf("moved node still at %s", addr)
	}
	if got, err := n.Client().ClusterMyID(ctx).Result(); err != nil || got != id || n.ID() != id {
		t.Errorf("moved node's ID = %q (ID() %q), %v; want it kept, %q", got, n.ID(), err, id)
	}
	// The old address stays claimed: nothing else may answer there while
	// peers may still remember it.
	oldHost, _, _ := net.SplitHostPort(addr)
	if _, ok, err := tryLock(oldHost, DefaultPort); ok || err != nil {
		t.Errorf("the old address %s was released: %v", addr, err)
	}

	addr = n.Addr()
	if err := c.Kill(n); err != nil {
		t.Fatal(err)
	}
	if err := c.Reschedule(n, false, false); err != nil {
		t.Fatal(err)
	}
	got, err := n.Client().ClusterMyID(ctx).Result()
	if err != nil || got == id || n.ID() != got || n.Addr() != addr {
		t.Errorf("node back as new: ID %q (ID() %q, was %q), %v, at %s (was %s); want a new ID at the same address", got, n.ID(), id, err, n.Addr(), addr)
	}

	flat := StartCluster(t, Options{Masters: 1, Unformed: true})
	if err := flat.Kill(flat.Nodes()[0]); err != nil {
		t.Fatal(err)
	}
	if err := flat.Reschedule(flat.Nodes()[0], true, true); err == nil || !strings.Contains(err.Error(), "IPPerNode") {
		t.Errorf("Reschedule to a new IP without IPPerNode: %v, want an error naming IPPerNode", err)
	}
}

// TestServerCommand runs a start script on a claimed host, as a
// container would run it, and checks that Kill ends everything the script
// started.
func TestServerCommand(t *testing.T) {
	t.Parallel()
	bin, err := FindServer()
	if err != nil {
		t.Fatal(err)
	}
	h := ClaimHost(t, DefaultPort)
	// The script forks the server rather than exec it, so only a kill of
	// the whole process group stops the server.
	script := `"$REDIS" --bind "$IP" --port 6379 --requirepass "$PW" --save "" --appendonly no & wait`
	s := StartServer(t, ServerOptions{
		Host: h.IP, Port: DefaultPort, Password: "pw",
		Command: []string{"sh", "-c", script},
		Env:     []string{"REDIS=" + bin, "IP=" + h.IP, "PW=pw"},
	})
	if got, want := s.Addr(), net.JoinHostPort(h.IP, strconv.Itoa(DefaultPort)); got != want {
		t.Errorf("Addr() = %s, want %s", got, want)
	}
	if err := s.Client().Ping(t.Context()).Err(); err != nil || !s.Running() {
		t.Fatalf("ping: %v, running %v", err, s.Running())
	}
	s.Kill()
	if s.Running() {
		t.Error("Running() after Kill")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !portsFree(h.IP, DefaultPort) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still bound after Kill: the forked server outlived its script", s.Addr())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWaitReplicated waits for a replica to catch up, and fails when the
// replica cannot.
func TestWaitReplicated(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, Options{Masters: 1, Replicas: 1})
	ctx := t.Context()
	master, replica := c.Nodes()[0], c.Nodes()[1]
	for i := range 100 {
		if err := master.Client().Set(ctx, "k"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	clients := []*redis.Client{master.Client(), replica.Client()}
	if err := WaitReplicated(ctx, clients, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := replica.Client().DBSize(ctx).Result(); err != nil || n != 100 {
		t.Errorf("replica holds %d keys, %v; want 100 once replicated", n, err)
	}
	// A replica whose master is not among clients (here: gone) never
	// counts as caught up.
	if err := c.Kill(master); err != nil {
		t.Fatal(err)
	}
	if err := WaitReplicated(ctx, []*redis.Client{replica.Client()}, 500*time.Millisecond); err == nil {
		t.Error("WaitReplicated succeeded for a replica without its master")
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
	// The restarted node comes back as a master of nothing and turns into
	// the promoted node's replica once it learns the newer config epoch,
	// which the cluster state being ok does not wait for: wait for it. The
	// deadline only bounds a hang.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		reps, err = c.ReplicasOf(ctx, promoted)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) == 1 && reps[0] == old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the restart, replicas of %v = %v, want the old master %v", promoted, reps, old)
		}
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
