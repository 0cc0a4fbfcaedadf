package simnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a long-running child process with its output in a log file.
// It dies with the process that started it (Pdeathsig).
type Process struct {
	// Name names the process in errors.
	Name string
	// Log is the file holding its stdout and stderr.
	Log string

	cmd  *exec.Cmd
	done chan struct{}
}

// StartProcess starts bin with args, its environment being this process's
// plus env, its output going to logPath. The kernel kills it with SIGKILL
// if the caller dies first.
func StartProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop asks the process to end with SIGTERM and kills it after grace. It
// returns once the process has exited, and is a no-op when it already has.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Exited returns nil while the process runs, and otherwise an error with
// its exit status and the tail of its log.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %s\n%s", p.Name, p.cmd.ProcessState, Tail(p.Log, 20))
	default:
		return nil
	}
}

// Tail returns the last n lines of the file at path, or "" when it cannot
// be read.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Run runs a short command in dir and returns its trimmed stdout; its
// stderr goes to stderr (nil discards it).
func Run(ctx context.Context, stderr io.Writer, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(out.String()), nil
}

// BuildBinaries builds floodgate-manager and floodgate-sidecar from the
// module at root into dir. Build output goes to stderr (nil discards it).
func BuildBinaries(ctx context.Context, stderr io.Writer, root, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	_, err := Run(ctx, stderr, root, "go", "build", "-o", dir+string(os.PathSeparator),
		"./cmd/floodgate-manager", "./cmd/floodgate-sidecar")
	return err
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// WaitHTTP polls url until it answers 200, p exits (when p is not nil),
// ctx ends or timeout passes.
func WaitHTTP(ctx context.Context, url string, p *Process, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	return Poll(ctx, 100*time.Millisecond, timeout, url+" answering 200", func() (bool, error) {
		if p != nil {
			if err := p.Exited(); err != nil {
				return false, err
			}
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil //nolint:nilerr // not answering yet: poll again
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// Poll calls cond every interval until it returns true or an error, ctx
// ends, or timeout passes; what names the awaited state in the timeout
// error.
func Poll(ctx context.Context, interval, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
