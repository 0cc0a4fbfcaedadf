package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configures a cluster. The zero value is a 3-master cluster
// without replicas.
type Options struct {
	// Masters is the number of masters, 1 to 16. 0 means 3.
	Masters int
	// Replicas is the number of replicas of each master, 0 to 5.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a node may be
	// unreachable before it is failed over. 0 means 2s. Fault tests that
	// wait for a failover lower it to 1s.
	NodeTimeout time.Duration
	// PartialCoverage sets cluster-require-full-coverage no, so that the
	// other shards keep serving while one shard has no master. Redis's
	// default (false here) stops the whole cluster.
	PartialCoverage bool
	// Password, when set, is required of clients (requirepass) and used
	// between nodes (masterauth).
	Password string
	// ExtraArgs are appended to every redis-server command line, for
	// example []string{"--maxmemory", "64mb"}.
	ExtraArgs []string
	// StartTimeout bounds starting and forming the cluster. 0 means 60s.
	StartTimeout time.Duration
	// IPPerNode puts every node on a loopback IP of its own, from
	// 127.1.0.0/16, all on Port, and announces that IP to the cluster
	// (--cluster-announce-ip), as Pods have IPs of their own. Reschedule
	// can then move a node to a new IP. By default the nodes share
	// 127.0.0.1, each on a port of its own.
	IPPerNode bool
	// Port is the port of every node with IPPerNode. 0 means DefaultPort.
	Port int
	// Unformed starts the Masters*(1+Replicas) nodes cluster-enabled but
	// alone, each a master without slots: the code under test forms them.
	// They keep Redis's replication defaults, as a CounterStore's Pods
	// do: a replica's full sync starts after repl-diskless-sync-delay
	// (5s), where the nodes of a formed cluster sync at once.
	Unformed bool
}

func (o *Options) setDefaults() error {
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = 2 * time.Second
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.IPPerNode && o.Port == 0 {
		o.Port = DefaultPort
	}
	var errs []error
	if o.Masters < 1 || o.Masters > 16 {
		errs = append(errs, fmt.Errorf("masters: must be between 1 and 16, got %d", o.Masters))
	}
	if o.Replicas < 0 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas: must be between 0 and 5, got %d", o.Replicas))
	}
	if o.NodeTimeout < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("nodeTimeout: must be at least 100ms, got %v", o.NodeTimeout))
	}
	switch {
	case !o.IPPerNode && o.Port != 0:
		errs = append(errs, fmt.Errorf("port: only with ipPerNode (the nodes on 127.0.0.1 each get a port of their own), got %d", o.Port))
	case o.IPPerNode && (o.Port < 1 || o.Port > 65535-busOffset):
		errs = append(errs, fmt.Errorf("port: must be between 1 and %d, so that the bus port port+%d is valid, got %d", 65535-busOffset, busOffset, o.Port))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redistest: invalid options: %w", err)
	}
	return nil
}

// Cluster is a running Redis Cluster of local redis-server processes on
// loopback. Its methods are safe for concurrent use.
type Cluster struct {
	opts  Options
	bin   string
	dir   string
	owned bool // dir was made by NewCluster and is removed by Close

	mu    sync.Mutex
	nodes []*Node // guarded by mu; only ever appended to

	closeOnce sync.Once
}

// Node is one redis-server process of a cluster. Its role can change under
// failover; ask the cluster (Masters, MasterForKey, Topology) for the
// current one.
type Node struct {
	c    *Cluster
	idx  int
	proc *process

	mu        sync.Mutex
	id        string
	lastSlots []SlotRange // slots served when last killed or paused
}

// StartCluster starts and forms a cluster for tb and registers its teardown
// with tb.Cleanup. It fails tb when redis-server is missing or the cluster
// cannot be formed.
func StartCluster(tb TB, opts Options) *Cluster {
	tb.Helper()
	return startFor(tb, func(dir string, ownDir bool) (*Cluster, error) { return newCluster(opts, dir, ownDir) })
}

// NewCluster starts and forms a cluster outside any test, for TestMain.
// The caller must call Close. Even without Close, the nodes die with the
// process.
func NewCluster(opts Options) (*Cluster, error) {
	return startOwned("redistest-cluster-", func(dir string, ownDir bool) (*Cluster, error) { return newCluster(opts, dir, ownDir) })
}

// Main starts one cluster for a whole test package: call it from TestMain.
// It hands the cluster to set, runs the tests, tears the cluster down and
// exits with the tests' code.
//
//	var cluster *redistest.Cluster
//
//	func TestMain(m *testing.M) {
//		redistest.Main(m, redistest.Options{Masters: 3, Replicas: 1}, func(c *redistest.Cluster) { cluster = c })
//	}
func Main(m *testing.M, opts Options, set func(*Cluster)) {
	c, err := NewCluster(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	set(c)
	code := m.Run()
	c.Close()
	os.Exit(code)
}

func newCluster(opts Options, dir string, owned bool) (*Cluster, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	bin, err := FindServer()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, bin: bin, dir: dir, owned: owned}
	deadline := time.Now().Add(opts.StartTimeout)
	if _, err := c.addNodes(opts.Masters*(1+opts.Replicas), deadline); err != nil {
		c.Close()
		return nil, err
	}
	if opts.Unformed {
		return c, nil
	}
	if err := c.form(deadline); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: forming a %d-master cluster with %d replicas each: %w", opts.Masters, opts.Replicas, err)
	}
	return c, nil
}

// AddNodes starts n more nodes, cluster-enabled and alone (no other node
// knows them), and returns them: the code under test adds them to the
// cluster. It waits until each answers, at most StartTimeout.
func (c *Cluster) AddNodes(n int) ([]*Node, error) {
	return c.addNodes(n, time.Now().Add(c.opts.StartTimeout))
}

func (c *Cluster) addNodes(n int, deadline time.Time) ([]*Node, error) {
	c.mu.Lock()
	added := make([]*Node, n)
	for i := range added {
		idx := len(c.nodes)
		added[i] = &Node{c: c, idx: idx, proc: &process{
			bin:          c.bin,
			dir:          filepath.Join(c.dir, "node"+strconv.Itoa(idx)),
			password:     c.opts.Password,
			cluster:      true,
			extra:        c.opts.ExtraArgs,
			ipPort:       c.opts.Port,
			replDefaults: c.opts.Unformed,
		}}
		c.nodes = append(c.nodes, added[i])
	}
	c.mu.Unlock()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, nd := range added {
		wg.Go(func() {
			if errs[i] = nd.proc.start(c.opts.NodeTimeout, c.opts.PartialCoverage, time.Until(deadline)); errs[i] != nil {
				return
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			errs[i] = nd.readID(ctx)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return added, nil
}

// readID asks the node for its cluster ID and remembers it.
func (n *Node) readID(ctx context.Context) error {
	id, err := n.Client().ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("redistest: cluster myid on %s: %w", n.Addr(), err)
	}
	n.mu.Lock()
	n.id = id
	n.mu.Unlock()
	return nil
}

// all returns the nodes, in the order they were started.
func (c *Cluster) all() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}

// form joins the started nodes into a cluster the way redis-cli --cluster
// create does: distinct config epochs, contiguous slot ranges for the
// masters, MEET, then REPLICATE.
func (c *Cluster) form(deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	m := c.opts.Masters
	nodes := c.all()
	for i, n := range nodes {
		cl := n.Client()
		if err := cl.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return fmt.Errorf("set-config-epoch on %s: %w", n.Addr(), err)
		}
		if i < m {
			start, end := i*16384/m, (i+1)*16384/m-1
			if err := cl.Do(ctx, "cluster", "addslotsrange", start, end).Err(); err != nil {
				return fmt.Errorf("addslotsrange %d-%d on %s: %w", start, end, n.Addr(), err)
			}
		}
	}
	// Meeting every pair converges faster than waiting for gossip.
	for i, a := range nodes {
		for _, b := range nodes[i+1:] {
			host, port := b.hostPort()
			if err := a.Client().ClusterMeet(ctx, host, strconv.Itoa(port)).Err(); err != nil {
				return fmt.Errorf("cluster meet %s -> %s: %w", a.Addr(), b.Addr(), err)
			}
		}
	}
	if err := c.waitAllKnown(ctx, nodes); err != nil {
		return err
	}
	for i := m; i < len(nodes); i++ {
		master := nodes[i%m]
		if err := nodes[i].Client().ClusterReplicate(ctx, master.ID()).Err(); err != nil {
			return fmt.Errorf("cluster replicate %s -> %s: %w", nodes[i].Addr(), master.Addr(), err)
		}
	}
	return c.WaitClusterOK(time.Until(deadline))
}

// waitAllKnown waits until every one of nodes knows every other, out of
// handshake and connected.
func (c *Cluster) waitAllKnown(ctx context.Context, nodes []*Node) error {
	var last error
	for {
		last = nil
		for _, n := range nodes {
			view, err := n.view(ctx)
			if err != nil {
				last = err
				break
			}
			linked := 0
			for _, v := range view {
				if !v.HasFlag("handshake") && (v.Connected || v.HasFlag("myself")) {
					linked++
				}
			}
			if linked != len(nodes) {
				last = fmt.Errorf("%s links %d of %d nodes", n.Addr(), linked, len(nodes))
				break
			}
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes did not all meet: %w", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close kills every node and removes the cluster's files. It is idempotent.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range c.all() {
			wg.Go(n.proc.close)
		}
		wg.Wait()
		if c.owned {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// Nodes returns every node, masters first in their formation order, then
// the replicas, then the nodes of AddNodes.
func (c *Cluster) Nodes() []*Node { return c.all() }

// Addrs returns the addresses of the running nodes, the seed list for a
// cluster client.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.all() {
		if alive, _ := n.proc.state(); alive {
			out = append(out, n.Addr())
		}
	}
	return out
}

// Password returns the password clients must send, or "".
func (c *Cluster) Password() string { return c.opts.Password }

// NewClient returns a go-redis cluster client for the cluster. The caller
// closes it.
func (c *Cluster) NewClient() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:       c.Addrs(),
		Password:    c.opts.Password,
		DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second,
	})
}

// liveNodes returns the nodes that run and are not paused.
func (c *Cluster) liveNodes() []*Node {
	var out []*Node
	for _, n := range c.all() {
		if alive, paused := n.proc.state(); alive && !paused {
			out = append(out, n)
		}
	}
	return out
}

func (c *Cluster) byID(id string) *Node {
	for _, n := range c.all() {
		if n.ID() == id {
			return n
		}
	}
	return nil
}

// Topology returns the cluster as the first live node sees it.
func (c *Cluster) Topology(ctx context.Context) ([]NodeInfo, error) {
	live := c.liveNodes()
	if len(live) == 0 {
		return nil, errors.New("redistest: no live node to ask")
	}
	return live[0].view(ctx)
}

// Masters returns the nodes that serve slots as masters and are not failed,
// as the first live node sees it.
func (c *Cluster) Masters(ctx context.Context) ([]*Node, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Node
	for _, v := range view {
		if v.IsMaster() && len(v.Slots) > 0 && !v.Failing() {
			if n := c.byID(v.ID); n != nil {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// ReplicasOf returns the nodes replicating master, as the first live node
// sees it.
func (c *Cluster) ReplicasOf(ctx context.Context, master *Node) ([]*Node, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Node
	for _, v := range view {
		if v.MasterID == master.ID() {
			if n := c.byID(v.ID); n != nil {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// KeySlot returns the hash slot of key, computed by Redis (CLUSTER KEYSLOT).
func (c *Cluster) KeySlot(ctx context.Context, key string) (int, error) {
	live := c.liveNodes()
	if len(live) == 0 {
		return 0, errors.New("redistest: no live node to ask")
	}
	slot, err := live[0].Client().ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("redistest: cluster keyslot: %w", err)
	}
	return int(slot), nil
}

// MasterForSlot returns the master serving slot, as the first live node
// sees it.
func (c *Cluster) MasterForSlot(ctx context.Context, slot int) (*Node, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range view {
		if v.IsMaster() && v.Owns(slot) {
			if n := c.byID(v.ID); n != nil {
				return n, nil
			}
			return nil, fmt.Errorf("redistest: slot %d is served by unknown node %s", slot, v.ID)
		}
	}
	return nil, fmt.Errorf("redistest: slot %d is not served", slot)
}

// MasterForKey returns the master serving key's slot.
func (c *Cluster) MasterForKey(ctx context.Context, key string) (*Node, error) {
	slot, err := c.KeySlot(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.MasterForSlot(ctx, slot)
}

// recordSlots remembers which slots n serves, as a peer sees it, before a
// fault is injected, so WaitForFailover knows what to wait for.
func (c *Cluster) recordSlots(n *Node) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var slots []SlotRange
	for _, peer := range append(c.liveNodesExcept(n), n) {
		view, err := peer.view(ctx)
		if err != nil {
			continue
		}
		for _, v := range view {
			if v.ID == n.ID() && v.IsMaster() {
				slots = v.Slots
			}
		}
		break
	}
	n.mu.Lock()
	n.lastSlots = slots
	n.mu.Unlock()
}

func (c *Cluster) liveNodesExcept(n *Node) []*Node {
	var out []*Node
	for _, m := range c.liveNodes() {
		if m != n {
			out = append(out, m)
		}
	}
	return out
}

// Kill sends SIGKILL to n and waits for it to exit. Its data is lost (no
// persistence); Restart brings it back empty with the same node ID.
func (c *Cluster) Kill(n *Node) error {
	if alive, _ := n.proc.state(); !alive {
		return fmt.Errorf("redistest: kill %s: not running", n.Addr())
	}
	c.recordSlots(n)
	n.proc.mu.Lock()
	n.proc.killLocked()
	n.proc.mu.Unlock()
	return nil
}

// Pause stops n with SIGSTOP: its sockets stay open but it answers nothing,
// like a hung host.
func (c *Cluster) Pause(n *Node) error {
	c.recordSlots(n)
	return n.proc.signal(syscall.SIGSTOP)
}

// Resume continues a paused node with SIGCONT.
func (c *Cluster) Resume(n *Node) error { return n.proc.signal(syscall.SIGCONT) }

// Restart starts a killed node again on its address, with its node ID and
// cluster config kept. It waits until the node answers PING; call
// WaitClusterOK to wait until the cluster has taken it back.
func (c *Cluster) Restart(n *Node) error {
	host, _ := n.hostPort()
	return c.restart(n, host, true)
}

// RestartAt starts a killed node again on a new loopback host (for example
// 127.0.0.2) with the same port and node ID, announcing the new address
// with --cluster-announce-ip, as a pod rescheduled with a new IP would.
func (c *Cluster) RestartAt(n *Node, host string) error {
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return fmt.Errorf("redistest: restart %s at %q: want an IPv4 loopback address such as 127.0.0.2", n.Addr(), host)
	}
	return c.restart(n, host, true)
}

// Reschedule starts a killed node again the way Kubernetes brings a Pod
// back: with newIP on a newly claimed loopback IP (Options.IPPerNode
// only), else on its address; with keepID with its nodes.conf, so as the
// same cluster node, else as a new, empty node with a new ID.
func (c *Cluster) Reschedule(n *Node, newIP, keepID bool) error {
	host, _ := n.hostPort()
	if newIP {
		var err error
		n.proc.mu.Lock()
		if n.proc.aliveLocked() {
			err = errors.New("still running, Kill it first")
		} else {
			host, err = n.proc.moveLocked()
		}
		n.proc.mu.Unlock()
		if err != nil {
			return fmt.Errorf("redistest: reschedule %s: %w", n.Addr(), err)
		}
	}
	return c.restart(n, host, keepID)
}

func (c *Cluster) restart(n *Node, host string, keepID bool) error {
	p := n.proc
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.aliveLocked() {
		return fmt.Errorf("redistest: restart %s: still running, Kill it first", p.addrLocked())
	}
	if host != p.host && !portsFree(host, p.port) {
		return fmt.Errorf("redistest: restart at %s:%d: port or bus port in use", host, p.port)
	}
	if !keepID {
		if err := os.Remove(filepath.Join(p.dir, "nodes.conf")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("redistest: restart %s as a new node: %w", p.addrLocked(), err)
		}
	}
	if err := p.spawnLocked(host, c.opts.NodeTimeout, c.opts.PartialCoverage, 30*time.Second); err != nil {
		return fmt.Errorf("redistest: restart %s: %w", n.ID(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, err := p.client.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("redistest: restart %s: cluster myid: %w", p.addrLocked(), err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case !keepID:
		n.id = id
	case id != n.id:
		return fmt.Errorf("redistest: restart %s: came back as node %s, want %s", p.addrLocked(), id, n.id)
	}
	return nil
}

// WaitClusterOK waits until every running, unpaused node reports
// cluster_state:ok with all 16384 slots served, all of them agree on which
// node serves each slot, every slot's master is running and not failed in
// anyone's view, no running node is flagged as failing, and every running
// replica's link to its master is up.
func (c *Cluster) WaitClusterOK(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		err := c.clusterOK(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster not ok after %v: %w", timeout, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (c *Cluster) clusterOK(ctx context.Context) error {
	live := c.liveNodes()
	if len(live) == 0 {
		return errors.New("no live node")
	}
	liveIDs := map[string]bool{}
	for _, n := range live {
		liveIDs[n.ID()] = true
	}
	var owners string
	for i, n := range live {
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("cluster info on %s: %w", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", n.Addr(), infoSummary(info))
		}
		view, err := n.view(ctx)
		if err != nil {
			return err
		}
		self := ""
		for _, v := range view {
			if v.HasFlag("myself") {
				if v.MasterID != "" {
					self = v.MasterID
				}
				continue
			}
			if liveIDs[v.ID] && v.Failing() {
				return fmt.Errorf("%s still flags live node %s as %v", n.Addr(), v.Addr, v.Flags)
			}
			if v.IsMaster() && len(v.Slots) > 0 && (!liveIDs[v.ID] || v.Failing()) {
				return fmt.Errorf("%s routes slots to %s, which is down", n.Addr(), v.Addr)
			}
		}
		o := slotOwners(view)
		if i == 0 {
			owners = o
		} else if o != owners {
			return fmt.Errorf("%s disagrees with %s on slot owners", n.Addr(), live[0].Addr())
		}
		if self != "" {
			repl, err := n.Client().Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("info replication on %s: %w", n.Addr(), err)
			}
			if !strings.Contains(repl, "master_link_status:up") {
				return fmt.Errorf("replica %s has no link to its master yet", n.Addr())
			}
		}
	}
	return nil
}

// WaitForFailover waits until the slots that n served when it was killed or
// paused are served by another running master, in every live node's view,
// and returns that master.
func (c *Cluster) WaitForFailover(n *Node, timeout time.Duration) (*Node, error) {
	n.mu.Lock()
	slots := n.lastSlots
	n.mu.Unlock()
	if len(slots) == 0 {
		return nil, fmt.Errorf("redistest: %s served no slots when it was killed or paused, so nothing fails over", n.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		m, err := c.failedOver(ctx, n, slots[0].Start)
		if err == nil {
			return m, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("redistest: no failover of %s within %v: %w", n.Addr(), timeout, last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (c *Cluster) failedOver(ctx context.Context, old *Node, slot int) (*Node, error) {
	var winner *Node
	for _, peer := range c.liveNodesExcept(old) {
		view, err := peer.view(ctx)
		if err != nil {
			return nil, err
		}
		var owner *Node
		for _, v := range view {
			if v.IsMaster() && v.Owns(slot) && !v.Failing() {
				owner = c.byID(v.ID)
			}
		}
		if owner == nil || owner == old {
			return nil, fmt.Errorf("%s still routes slot %d to the old master", peer.Addr(), slot)
		}
		if winner != nil && owner != winner {
			return nil, fmt.Errorf("views disagree on the new master of slot %d", slot)
		}
		winner = owner
	}
	if winner == nil {
		return nil, errors.New("no live peer")
	}
	role, err := winner.Client().Do(ctx, "role").Slice()
	if err != nil {
		return nil, fmt.Errorf("role on %s: %w", winner.Addr(), err)
	}
	if len(role) == 0 || role[0] != "master" {
		return nil, fmt.Errorf("%s is not master yet", winner.Addr())
	}
	return winner, nil
}

// promotionLine is what redis-server logs, on the replica that wins a
// failover election, at the instant it takes over its master's slots.
const promotionLine = "Failover election won: I'm the new master."

// PromotedAt returns when n last won a failover election, as n itself
// logged it (see LoggedAt): the instant its master's slots became n's,
// which is the event a client of the cluster reacts to.
func (n *Node) PromotedAt() (time.Time, error) {
	return n.LoggedAt(promotionLine)
}

// LoggedAt returns when n last logged a line containing msg in its
// redis.log, by the line's own timestamp: the instant of an event of the
// node's, which a client reacts to, as the node saw it. The timestamps
// are the machine's local time, to the millisecond, on the same clock as
// the test's.
func (n *Node) LoggedAt(msg string) (time.Time, error) {
	b, err := os.ReadFile(filepath.Join(n.Dir(), "redis.log"))
	if err != nil {
		return time.Time{}, err
	}
	var last string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, msg) {
			last = line
		}
	}
	if last == "" {
		return time.Time{}, fmt.Errorf("redistest: %s logged no %q", n.Addr(), msg)
	}
	at, err := logTime(last)
	if err != nil {
		return time.Time{}, fmt.Errorf("redistest: %s: %w", n.Addr(), err)
	}
	return at, nil
}

// logLayout is the timestamp of a redis.log line.
const logLayout = "02 Jan 2006 15:04:05.000"

// logTime reads the timestamp of a redis.log line, which looks like
// "4242:S 05 Dec 2026 23:41:42.123 # message", in local time.
func logTime(line string) (time.Time, error) {
	_, rest, ok := strings.Cut(line, " ")
	if !ok || len(rest) < len(logLayout) {
		return time.Time{}, fmt.Errorf("no timestamp in log line %q", line)
	}
	return time.ParseInLocation(logLayout, rest[:len(logLayout)], time.Local)
}

// ID returns the node's cluster ID, a new one after Reschedule without
// keepID.
func (n *Node) ID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.id
}

// Addr returns the node's current host:port.
func (n *Node) Addr() string {
	n.proc.mu.Lock()
	defer n.proc.mu.Unlock()
	return n.proc.addrLocked()
}

func (n *Node) hostPort() (string, int) {
	n.proc.mu.Lock()
	defer n.proc.mu.Unlock()
	return n.proc.host, n.proc.port
}

// Pid returns the process ID of the node's redis-server, 0 when it is not
// running.
func (n *Node) Pid() int {
	n.proc.mu.Lock()
	defer n.proc.mu.Unlock()
	if !n.proc.aliveLocked() {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Running reports whether the node's process runs (paused or not).
func (n *Node) Running() bool {
	alive, _ := n.proc.state()
	return alive
}

// Paused reports whether the node is stopped by Pause.
func (n *Node) Paused() bool {
	_, paused := n.proc.state()
	return paused
}

// Client returns a plain client for this one node, for admin commands. It
// does not retry and must not be closed by the caller; it is replaced on
// restart, so fetch it again after one.
func (n *Node) Client() *redis.Client {
	n.proc.mu.Lock()
	defer n.proc.mu.Unlock()
	return n.proc.client
}

// Dir returns the node's data directory, which holds redis.log.
func (n *Node) Dir() string { return n.proc.dir }

// String returns the node's address and ID prefix.
func (n *Node) String() string {
	id := n.ID()
	if len(id) > 8 {
		id = id[:8]
	}
	return n.Addr() + "/" + id
}

// view returns CLUSTER NODES as n sees it.
func (n *Node) view(ctx context.Context) ([]NodeInfo, error) {
	s, err := n.Client().ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redistest: cluster nodes on %s: %w", n.Addr(), err)
	}
	return parseClusterNodes(s)
}

// infoSummary picks the state and slot counters out of CLUSTER INFO.
func infoSummary(info string) string {
	var parts []string
	for _, f := range strings.Fields(info) {
		if strings.HasPrefix(f, "cluster_state:") || strings.HasPrefix(f, "cluster_slots_") {
			parts = append(parts, f)
		}
	}
	return strings.Join(parts, " ")
}
