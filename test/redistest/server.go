package redistest

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ServerOptions configures a single, non-cluster redis-server.
type ServerOptions struct {
	// Password, when set, is required of clients.
	Password string
	// ExtraArgs are appended to the redis-server command line.
	ExtraArgs []string
	// StartTimeout bounds the start. 0 means 30s.
	StartTimeout time.Duration
}

// Server is one standalone redis-server process on loopback. Its methods
// are safe for concurrent use.
type Server struct {
	proc      *process
	dir       string
	owned     bool
	closeOnce sync.Once
}

// StartServer starts a standalone redis-server for tb and registers its
// teardown with tb.Cleanup. It fails tb when redis-server is missing or does
// not start.
func StartServer(tb testing.TB, opts ServerOptions) *Server {
	tb.Helper()
	s, err := newServer(opts, tb.TempDir(), false)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// NewServer starts a standalone redis-server outside any test, for
// TestMain. The caller must call Close.
func NewServer(opts ServerOptions) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-server-")
	if err != nil {
		return nil, fmt.Errorf("redistest: temp dir: %w", err)
	}
	s, err := newServer(opts, dir, true)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func newServer(opts ServerOptions, dir string, owned bool) (*Server, error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	bin, err := FindServer()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, owned: owned, proc: &process{
		bin:      bin,
		dir:      dir,
		password: opts.Password,
		extra:    opts.ExtraArgs,
	}}
	if err := s.proc.start(0, false, opts.StartTimeout); err != nil {
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
