package redistest

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ServerOptions configures a single, non-cluster redis-server, or a
// command that runs one.
type ServerOptions struct {
	// Password, when set, is required of clients.
	Password string
	// ExtraArgs are appended to the redis-server command line.
	ExtraArgs []string
	// StartTimeout bounds the start. 0 means 30s.
	StartTimeout time.Duration
	// Host and Port, when set, are where the server listens: a Host
	// claimed with ClaimHost, say. By default it gets a free port on
	// 127.0.0.1.
	Host string
	Port int
	// Command, when set, runs instead of redis-server (and ExtraArgs): a
	// container's start script, for example, which must serve Redis, with
	// Password, at Host and Port. Env is added to its environment.
	Command []string
	Env     []string
}

func (o *ServerOptions) setDefaults() error {
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	var errs []error
	if (o.Host == "") != (o.Port == 0) {
		errs = append(errs, fmt.Errorf("host %q and port %d: set both or neither", o.Host, o.Port))
	}
	if o.Port < 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: must be between 1 and 65535, got %d", o.Port))
	}
	if len(o.Command) > 0 && o.Host == "" {
		errs = append(errs, errors.New("command: needs the host and port it serves on"))
	}
	if len(o.Command) > 0 && len(o.ExtraArgs) > 0 {
		errs = append(errs, errors.New("extraArgs: redis-server arguments do not apply to a command"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redistest: invalid server options: %w", err)
	}
	return nil
}

// Server is one standalone redis-server process on loopback, or the
// process of ServerOptions.Command. Its methods are safe for concurrent
// use.
type Server struct {
	proc      *process
	dir       string
	owned     bool
	closeOnce sync.Once
}

// StartServer starts a standalone redis-server for tb and registers its
// teardown with tb.Cleanup. It fails tb when redis-server is missing or does
// not start.
func StartServer(tb TB, opts ServerOptions) *Server {
	tb.Helper()
	return startFor(tb, func(dir string, ownDir bool) (*Server, error) { return newServer(opts, dir, ownDir) })
}

// NewServer starts a standalone redis-server outside any test, for
// TestMain. The caller must call Close.
func NewServer(opts ServerOptions) (*Server, error) {
	return startOwned("redistest-server-", func(dir string, ownDir bool) (*Server, error) { return newServer(opts, dir, ownDir) })
}

// startFor starts what newFn starts in tb's temporary directory, and
// registers its Close with tb.Cleanup. It fails tb when newFn fails.
func startFor[T interface{ Close() }](tb TB, newFn func(dir string, ownDir bool) (T, error)) T {
	tb.Helper()
	v, err := newFn(tb.TempDir(), false)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(v.Close)
	return v
}

// startOwned starts what newFn starts in a new temporary directory that the
// result owns (its Close removes it), outside any test.
func startOwned[T any](prefix string, newFn func(dir string, ownDir bool) (T, error)) (T, error) {
	var zero T
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return zero, fmt.Errorf("redistest: temp dir: %w", err)
	}
	v, err := newFn(dir, true)
	if err != nil {
		_ = os.RemoveAll(dir)
		return zero, err
	}
	return v, nil
}

func newServer(opts ServerOptions, dir string, owned bool) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{dir: dir, owned: owned, proc: &process{
		dir:      dir,
		password: opts.Password,
		extra:    opts.ExtraArgs,
		command:  opts.Command,
		env:      opts.Env,
	}}
	if len(opts.Command) == 0 {
		bin, err := FindServer()
		if err != nil {
			return nil, err
		}
		s.proc.bin = bin
	}
	var err error
	if opts.Host == "" {
		err = s.proc.start(0, false, opts.StartTimeout)
	} else {
		s.proc.mu.Lock()
		s.proc.port = opts.Port
		err = s.proc.spawnLocked(opts.Host, 0, false, opts.StartTimeout)
		s.proc.mu.Unlock()
	}
	if err != nil {
		s.proc.close()
		return nil, err
	}
	return s, nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	s.proc.mu.Lock()
	defer s.proc.mu.Unlock()
	return s.proc.addrLocked()
}

// Pid returns the process ID of redis-server, 0 when it is not running.
func (s *Server) Pid() int {
	s.proc.mu.Lock()
	defer s.proc.mu.Unlock()
	if !s.proc.aliveLocked() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Client returns a plain client for admin commands. The caller must not
// close it; it is replaced on Restart.
func (s *Server) Client() *redis.Client {
	s.proc.mu.Lock()
	defer s.proc.mu.Unlock()
	return s.proc.client
}

// Running reports whether the server's process runs.
func (s *Server) Running() bool {
	alive, _ := s.proc.state()
	return alive
}

// Kill sends SIGKILL and waits for the exit.
func (s *Server) Kill() {
	s.proc.mu.Lock()
	defer s.proc.mu.Unlock()
	s.proc.killLocked()
}

// Pause stops the server with SIGSTOP.
func (s *Server) Pause() error { return s.proc.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.proc.signal(syscall.SIGCONT) }

// Restart starts a killed server again on the same address, empty.
func (s *Server) Restart() error {
	s.proc.mu.Lock()
	defer s.proc.mu.Unlock()
	if s.proc.aliveLocked() {
		return fmt.Errorf("redistest: restart %s: still running, Kill it first", s.proc.addrLocked())
	}
	if err := s.proc.spawnLocked(s.proc.host, 0, false, 30*time.Second); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	return nil
}

// Close kills the server and removes its files. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.proc.close()
		if s.owned {
			_ = os.RemoveAll(s.dir)
		}
	})
}
