// Package nodetest runs real redis-server processes for the CounterStore
// tests, each on a loopback address of its own (127.64.0.0/10, as a Pod
// has an IP of its own), unformed: the code under test forms the cluster.
//
// A Host is a claimed loopback IP: a flock under
// $TMPDIR/floodgate-counterstore-hosts keeps concurrent test processes
// from claiming the same one, and the claim checks that the node port and
// its cluster bus port (port+10000) are free there. Every process is
// started with Pdeathsig SIGKILL, so none outlives the test binary.
package nodetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// TB is the part of testing.TB the helpers use; ginkgo.GinkgoT() has it
// too.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
	TempDir() string
}

// DefaultPort is the port the nodes listen on, the one the CounterStore's
// Pods use.
const DefaultPort = 6379

// Host is a claimed loopback IP.
type Host struct {
	IP   string
	lock *os.File
}

// Release gives the claim up.
func (h *Host) Release() {
	if h.lock != nil {
		_ = h.lock.Close() // closing drops the flock
		h.lock = nil
	}
}

// ClaimHost claims a loopback IP on which port and port+10000 are free,
// and releases it when tb ends.
func ClaimHost(tb TB, port int) *Host {
	tb.Helper()
	h, err := claimHost(port)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Release)
	return h
}

// NewHost claims a loopback IP like ClaimHost, outside any test; the
// caller releases it.
func NewHost(port int) (*Host, error) { return claimHost(port) }

func claimHost(port int) (*Host, error) {
	dir := filepath.Join(os.TempDir(), "floodgate-counterstore-hosts")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("nodetest: host lock dir: %w", err)
	}
	for range 200 {
		ip := net.IPv4(127, byte(64+rand.IntN(64)), byte(rand.IntN(256)), byte(1+rand.IntN(254))).String()
		f, err := os.OpenFile(filepath.Join(dir, ip), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return nil, fmt.Errorf("nodetest: host lock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			continue
		}
		if portsFree(ip, port) {
			return &Host{IP: ip, lock: f}, nil
		}
		_ = f.Close()
	}
	return nil, fmt.Errorf("nodetest: no free loopback address for port %d after 200 tries", port)
}

func portsFree(ip string, port int) bool {
	for _, p := range []int{port, port + 10000} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = ln.Close()
	}
	return true
}

// FindServer returns the path of redis-server, or an error naming the
// command that installs it.
func FindServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server", nil
	}
	return "", errors.New("nodetest: redis-server not found: run `hack/redis-cluster.sh install`")
}

// Process is one running server process that answers PING at Addr. Its
// methods are safe for concurrent use.
type Process struct {
	Addr     string
	Password string
	Dir      string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	client *redis.Client
}

// StartProcess runs name with args and env (added to the test's
// environment) in dir, and waits until a server answers PING at addr with
// password. Output goes to dir/stdout.log.
func StartProcess(addr, password, dir, name string, args, env []string) (*Process, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("nodetest: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nodetest: %w", err)
	}
	defer func() { _ = out.Close() }() // the child has its own descriptor
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("nodetest: start %s: %w", name, err)
	}
	p := &Process{Addr: addr, Password: password, Dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit is reported through done and the log
		close(p.done)
	}()
	p.client = redis.NewClient(&redis.Options{
		Addr: addr, Password: password, Protocol: 2, DisableIdentity: true,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		MaxRetries: -1, PoolSize: 2, PipelinePoolSize: -1, DialerRetries: 1,
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := p.client.Ping(ctx).Err()
		cancel()
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			_ = p.client.Close()
			return nil, fmt.Errorf("nodetest: %s at %s exited during start: %s", name, addr, tail(filepath.Join(dir, "stdout.log"))+tail(filepath.Join(dir, "redis.log")))
		default:
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("nodetest: %s at %s did not answer PING in 20s: %w", name, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a client for admin commands on this one server. Do not
// close it.
func (p *Process) Client() *redis.Client { return p.client }

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL to the process (and its process group, for a shell
// that runs the server) and waits for it to exit. It is idempotent.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the group this process leads
		<-p.done
	}
	if p.client != nil {
		_ = p.client.Close()
		p.client = nil
	}
}

// Alive reports whether the process runs.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, "\n")
}

// Options are a cluster node's settings.
type Options struct {
	// Password is requirepass and masterauth.
	Password string
	// NodeTimeout is cluster-node-timeout. 0 means 1s.
	NodeTimeout time.Duration
	// Port is the node port. 0 means DefaultPort.
	Port int
}

// Node is an unformed cluster-enabled redis-server that can be killed and
// brought back, at the same or another address, with or without its
// cluster identity.
type Node struct {
	tb   TB
	opts Options
	bin  string
	dir  string

	mu   sync.Mutex
	host *Host
	proc *Process
}

// StartNode claims a loopback IP and starts a cluster-enabled node there,
// configured as the CounterStore's nodes are: no persistence, partial
// coverage served, replicas always allowed to fail over, no automatic
// replica migration.
func StartNode(tb TB, opts Options) *Node {
	tb.Helper()
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = time.Second
	}
	if opts.Port == 0 {
		opts.Port = DefaultPort
	}
	bin, err := FindServer()
	if err != nil {
		tb.Fatal(err)
	}
	n := &Node{tb: tb, opts: opts, bin: bin, dir: tb.TempDir()}
	if err := n.start(ClaimHost(tb, opts.Port)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.Kill)
	return n
}

func (n *Node) start(h *Host) error {
	addr := net.JoinHostPort(h.IP, strconv.Itoa(n.opts.Port))
	args := []string{
		"--port", strconv.Itoa(n.opts.Port),
		"--bind", h.IP,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", n.dir,
		"--logfile", filepath.Join(n.dir, "redis.log"),
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--cluster-node-timeout", strconv.FormatInt(n.opts.NodeTimeout.Milliseconds(), 10),
		"--cluster-announce-ip", h.IP,
		"--cluster-require-full-coverage", "no",
		"--cluster-replica-validity-factor", "0",
		"--cluster-allow-replica-migration", "no",
	}
	if n.opts.Password != "" {
		args = append(args, "--requirepass", n.opts.Password, "--masterauth", n.opts.Password)
	}
	p, err := StartProcess(addr, n.opts.Password, n.dir, n.bin, args, nil)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.host, n.proc = h, p
	n.mu.Unlock()
	return nil
}

// Addr returns the node's host:port.
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.Addr
}

// Client returns an admin client for the node; fetch it again after a
// restart.
func (n *Node) Client() *redis.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.Client()
}

// Alive reports whether the node's process runs.
func (n *Node) Alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.Alive()
}

// ID returns the node's cluster ID.
func (n *Node) ID(ctx context.Context) (string, error) {
	id, err := n.Client().ClusterMyID(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("cluster myid on %s: %w", n.Addr(), err)
	}
	return id, nil
}

// Kill kills the node's process; its data is gone (no persistence). It is
// idempotent.
func (n *Node) Kill() {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart starts the killed node again. With newAddress it moves to a
// freshly claimed loopback IP, as a rescheduled Pod would. With keepID it
// keeps nodes.conf, so it comes back as the same cluster node (and knows
// its peers); without, it comes back as a new, empty node.
func (n *Node) Restart(newAddress, keepID bool) error {
	n.mu.Lock()
	if n.proc.Alive() {
		n.mu.Unlock()
		return fmt.Errorf("nodetest: restart %s: still running", n.proc.Addr)
	}
	h := n.host
	n.mu.Unlock()
	if !keepID {
		if err := os.Remove(filepath.Join(n.dir, "nodes.conf")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("nodetest: %w", err)
		}
	}
	if newAddress {
		nh, err := claimHost(n.opts.Port)
		if err != nil {
			return err
		}
		n.tb.Cleanup(nh.Release)
		h = nh
	}
	return n.start(h)
}

// WaitReplicated waits until every replica among clients has its link to
// its master up and has caught up with the master's replication offset
// (the masters must be among clients too), so that a test that then kills
// a master loses no write. It gives up after timeout.
func WaitReplicated(ctx context.Context, clients []*redis.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		offsets := map[string]int64{}
		type replica struct {
			addr, master string
			offset       int64
			up           bool
		}
		var replicas []replica
		for _, c := range clients {
			info, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("nodetest: info replication on %s: %w", c.Options().Addr, err)
			}
			if infoField(info, "role") == "master" {
				offsets[c.Options().Addr] = infoInt(info, "master_repl_offset")
				continue
			}
			replicas = append(replicas, replica{
				addr:   c.Options().Addr,
				master: net.JoinHostPort(infoField(info, "master_host"), infoField(info, "master_port")),
				offset: infoInt(info, "slave_repl_offset"),
				up:     infoField(info, "master_link_status") == "up",
			})
		}
		behind := ""
		for _, r := range replicas {
			if want, ok := offsets[r.master]; !r.up || !ok || r.offset < want {
				behind = r.addr
			}
		}
		if behind == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodetest: replica %s did not catch up with its master in %v", behind, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

func infoInt(info, field string) int64 {
	n, _ := strconv.ParseInt(infoField(info, field), 10, 64)
	return n
}
