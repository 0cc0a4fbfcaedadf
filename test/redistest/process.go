package redistest

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

// Port selection. Nodes take a port in [portLow, portHigh) on loopback and
// their cluster bus the port plus busOffset, so node ports and bus ports
// come from disjoint ranges, and both stay below the kernel's usual
// ephemeral range (32768 and up) that outgoing connections draw from. A
// node on a loopback IP of its own (Options.IPPerNode) takes a fixed port
// there instead, by default DefaultPort.
const (
	loopback  = "127.0.0.1"
	portLow   = 12000
	portHigh  = 22000
	busOffset = 10000
	// DefaultPort is the port of the nodes with IPPerNode, Redis's own.
	DefaultPort = 6379
)

// startAttempts bounds how often a node start is retried on a new port
// after losing a bind race.
const startAttempts = 20

// FindServer returns the path of redis-server: the one on PATH, else
// /usr/bin/redis-server.
func FindServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	const debian = "/usr/bin/redis-server"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", errors.New("redistest: redis-server not found on PATH or at /usr/bin/redis-server: run `hack/redis-cluster.sh install` (as root or with sudo) to install it")
}

// addrLock is an exclusive, cross-process claim on an address, held as a
// flock on a file under the temp dir. The kernel drops it when the process
// dies, so a crashed test never leaks a claim.
type addrLock struct {
	host string
	port int
	f    *os.File
}

func lockDir() (string, error) {
	dir := filepath.Join(os.TempDir(), "floodgate-redistest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", fmt.Errorf("redistest: port lock dir: %w", err)
	}
	return dir, nil
}

// tryLock claims host:port for this process or reports false. A claim on
// the shared loopback address is named by its port alone, one on a
// loopback IP of its own by the IP and the port.
func tryLock(host string, port int) (*addrLock, bool, error) {
	dir, err := lockDir()
	if err != nil {
		return nil, false, err
	}
	name := strconv.Itoa(port)
	if host != loopback {
		name = host + ":" + name
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false, fmt.Errorf("redistest: lock %s: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("redistest: flock %s: %w", name, err)
	}
	return &addrLock{host: host, port: port, f: f}, true, nil
}

func (l *addrLock) release() {
	if l != nil && l.f != nil {
		_ = l.f.Close() // closing drops the flock
		l.f = nil
	}
}

// portsFree reports whether host:port and host:port+busOffset can be bound
// right now.
func portsFree(host string, port int) bool {
	for _, p := range []int{port, port + busOffset} {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = ln.Close()
	}
	return true
}

// claimPort finds a port on the shared loopback address whose bus port is
// free too, claims it and returns the claim.
func claimPort() (*addrLock, error) {
	l, err := claimFree(func() (string, int) { return loopback, portLow + rand.IntN(portHigh-portLow) })
	if err != nil {
		return nil, fmt.Errorf("redistest: no free port pair (p, p+%d) in [%d, %d) on %s: %w", busOffset, portLow, portHigh, loopback, err)
	}
	return l, nil
}

// claimIP finds a loopback IP of 127.1.0.0/16 on which port and its bus
// port are free, claims it and returns the claim.
func claimIP(port int) (*addrLock, error) {
	l, err := claimFree(func() (string, int) {
		return net.IPv4(127, 1, byte(rand.IntN(256)), byte(1+rand.IntN(254))).String(), port
	})
	if err != nil {
		return nil, fmt.Errorf("redistest: no loopback IP in 127.1.0.0/16 with ports %d and %d free: %w", port, port+busOffset, err)
	}
	return l, nil
}

// claimFree claims the first address that next picks, of up to 500, that
// no one else claimed and whose port and bus port are free.
func claimFree(next func() (host string, port int)) (*addrLock, error) {
	for range 500 {
		host, port := next()
		l, ok, err := tryLock(host, port)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if portsFree(host, port) {
			return l, nil
		}
		l.release()
	}
	return nil, errors.New("none free after 500 tries")
}

// process is one redis-server child, or a command that runs one (a
// container's start script, say). Its fields are guarded by mu.
type process struct {
	bin      string
	dir      string // data dir, also holds logs and nodes.conf
	password string
	cluster  bool
	extra    []string // extra redis-server arguments from the options
	// command, when set, runs instead of redis-server, with env added to
	// the environment; it must serve Redis on the process's address.
	command, env []string
	// ipPort, when set, makes start claim a loopback IP of its own for
	// this port, instead of a port on the shared loopback address.
	ipPort int
	// replDefaults keeps Redis's replication defaults, which the
	// CounterStore's Pods run with, instead of the fast first sync.
	replDefaults bool

	mu     sync.Mutex
	host   string
	port   int
	lock   *addrLock
	held   []*addrLock // claims of addresses the process has left
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited
	paused bool
	client *redis.Client
	starts int
}

func (p *process) addrLocked() string {
	return net.JoinHostPort(p.host, strconv.Itoa(p.port))
}

// args builds the redis-server command line.
func (p *process) args(host string, port int, nodeTimeout time.Duration, partial bool) []string {
	a := []string{
		"--port", strconv.Itoa(port),
		"--bind", host,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", p.dir,
		"--logfile", filepath.Join(p.dir, "redis.log"),
		"--enable-debug-command", "local",
	}
	if !p.replDefaults {
		// A replica starts its first sync at once instead of after the
		// 5s that Redis waits to serve several replicas with one
		// snapshot: until it has synced it cannot be promoted.
		a = append(a, "--repl-diskless-sync-delay", "0")
	}
	if p.password != "" {
		a = append(a, "--requirepass", p.password, "--masterauth", p.password)
	}
	if p.cluster {
		coverage := "yes"
		if partial {
			coverage = "no"
		}
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(p.dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--cluster-announce-ip", host,
			"--cluster-require-full-coverage", coverage,
			"--cluster-replica-validity-factor", "0",
			"--cluster-allow-replica-migration", "no",
		)
	}
	return append(a, p.extra...)
}

// errAddrInUse marks a start that lost a bind race.
var errAddrInUse = errors.New("address already in use")

// spawn starts redis-server on host and the claimed port and waits until it
// answers PING. It must be called with p.mu held.
func (p *process) spawnLocked(host string, nodeTimeout time.Duration, partial bool, wait time.Duration) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("redistest: data dir: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(p.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: stdout log: %w", err)
	}
	defer func() { _ = out.Close() }()
	// Truncate the redis log so that a bind error found there is this
	// start's, not a previous one's.
	logPath := filepath.Join(p.dir, "redis.log")
	if err := os.WriteFile(logPath, nil, 0o644); err != nil {
		return fmt.Errorf("redistest: redis log: %w", err)
	}
	cmd := exec.Command(p.bin, p.args(host, p.port, nodeTimeout, partial)...)
	if len(p.command) > 0 {
		cmd = exec.Command(p.command[0], p.command[1:]...)
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Dir = p.dir
	cmd.Stdout = out
	cmd.Stderr = out
	// Pdeathsig makes the kernel SIGKILL the child when the test process
	// dies, however it dies, so no node outlives its test. The child leads
	// a process group, which Kill ends whole, should a command fork.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait() //nolint:errcheck // the exit status is read from the log
		close(done)
	}()
	p.host = host
	p.cmd = cmd
	p.done = done
	p.paused = false
	p.starts++
	if p.client != nil {
		_ = p.client.Close()
	}
	p.client = redis.NewClient(&redis.Options{
		Addr:          p.addrLocked(),
		Password:      p.password,
		DialTimeout:   time.Second,
		ReadTimeout:   2 * time.Second,
		WriteTimeout:  2 * time.Second,
		MaxRetries:    -1,
		DialerRetries: 1,
		PoolSize:      4,
		Protocol:      2,
	})

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			logTail := tail(logPath, 10) + tail(filepath.Join(p.dir, "stdout.log"), 5)
			if strings.Contains(logTail, "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("redistest: %s on %s exited during start: %s", cmd.Path, p.addrLocked(), logTail)
		case <-ctx.Done():
			p.killLocked()
			return fmt.Errorf("redistest: %s on %s did not answer PING within %v: %s", cmd.Path, p.addrLocked(), wait, tail(logPath, 10)+tail(filepath.Join(p.dir, "stdout.log"), 5))
		case <-tick.C:
			// Dial first: go-redis logs every failed dial, and the node
			// refuses connections until it has bound its port.
			c, err := net.DialTimeout("tcp", p.addrLocked(), 200*time.Millisecond)
			if err != nil {
				continue
			}
			_ = c.Close()
			pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err = p.client.Ping(pctx).Err()
			pcancel()
			if err == nil {
				return nil
			}
		}
	}
}

// start claims an address and starts the process, retrying on a new one
// when another process wins the bind race.
func (p *process) start(nodeTimeout time.Duration, partial bool, wait time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last error
	for range startAttempts {
		l, err := p.claim()
		if err != nil {
			return err
		}
		p.lock = l
		p.port = l.port
		err = p.spawnLocked(l.host, nodeTimeout, partial, wait)
		if err == nil {
			return nil
		}
		p.lock.release()
		p.lock = nil
		if !errors.Is(err, errAddrInUse) {
			return err
		}
		last = err
	}
	return fmt.Errorf("redistest: could not bind an address after %d tries: %w", startAttempts, last)
}

// claim claims the address to start on: a loopback IP of its own with
// ipPort, else a port on the shared loopback address.
func (p *process) claim() (*addrLock, error) {
	if p.ipPort != 0 {
		return claimIP(p.ipPort)
	}
	return claimPort()
}

// moveLocked claims a new loopback IP for a process with ipPort. The old
// claim is kept until close: peers may still gossip with the old address,
// and no other test's node may answer there meanwhile.
func (p *process) moveLocked() (string, error) {
	if p.ipPort == 0 {
		return "", errors.New("redistest: a node moves to a new IP only with Options.IPPerNode")
	}
	l, err := claimIP(p.ipPort)
	if err != nil {
		return "", err
	}
	p.held = append(p.held, p.lock)
	p.lock = l
	return l.host, nil
}

// killLocked sends SIGKILL and waits for the exit. Callers hold p.mu.
func (p *process) killLocked() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	// The group this process leads; a paused process dies from SIGKILL
	// too.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// signal sends sig to a running process.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.aliveLocked() {
		return fmt.Errorf("redistest: node %s is not running", p.addrLocked())
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: signal %v to %s: %w", sig, p.addrLocked(), err)
	}
	p.paused = sig == syscall.SIGSTOP
	return nil
}

func (p *process) aliveLocked() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// state reports whether the process runs and whether it is stopped.
func (p *process) state() (alive, paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.aliveLocked()
	return a, a && p.paused
}

// close kills the process, closes its client and drops the port claim.
func (p *process) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	if p.client != nil {
		_ = p.client.Close()
		p.client = nil
	}
	p.lock.release()
	for _, l := range p.held {
		l.release()
	}
	p.held = nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a loopback port that is free now and that no other
// redistest user will pick until tb's end, for a second listener of a node
// (a TLS port, say). Its bus port (port+10000) is free too.
func FreePort(tb TB) int {
	tb.Helper()
	l, err := claimPort()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(l.release)
	return l.port
}
