package runner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// memoryCgroup is a memory cgroup that holds a process to a limit as its
// container's would: the kernel charges it the process's anonymous
// memory, the page cache it faults in and, on cgroup v1 with kernel
// memory accounting, the kernel's own objects for it (sockets among
// them), and kills the process when reclaim cannot bring the charge
// under the limit.
type memoryCgroup struct {
	dir string
	v2  bool
}

// newMemoryCgroup makes a memory cgroup with the given limit and no swap,
// removed at the end of the test; nil, with the reason, when this machine
// does not let the test make one (not root, or no memory controller).
func newMemoryCgroup(t *testing.T, limit int64) (*memoryCgroup, error) {
	t.Helper()
	name := fmt.Sprintf("floodgate-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var g *memoryCgroup
	var files [][2]string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		g = &memoryCgroup{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
		files = [][2]string{{"memory.max", strconv.FormatInt(limit, 10)}, {"memory.swap.max", "0"}}
	} else {
		g = &memoryCgroup{dir: filepath.Join("/sys/fs/cgroup/memory", name)}
		// memsw (memory and swap) can only be set once the memory
		// limit is, and is absent without swap accounting.
		files = [][2]string{{"memory.limit_in_bytes", strconv.FormatInt(limit, 10)}, {"memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)}}
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		// The group empties once its process is reaped (the process's
		// own cleanup, registered later, runs first).
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := os.Remove(g.dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("remove cgroup %s: %v", g.dir, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	for i, f := range files {
		err := os.WriteFile(filepath.Join(g.dir, f[0]), []byte(f[1]), 0)
		if err != nil && i == 0 {
			return nil, fmt.Errorf("set %s: %w", f[0], err)
		}
	}
	if got, ok := g.limit(); !ok || got != limit {
		return nil, fmt.Errorf("the cgroup's limit reads %d, want %d", got, limit)
	}
	return g, nil
}

// command returns cmd so that its process starts inside the group: a
// shell joins the group, then executes cmd's program in its place (the
// same process), so nothing it allocates is charged elsewhere.
func (g *memoryCgroup) command(cmd *exec.Cmd) *exec.Cmd {
	procs := filepath.Join(g.dir, "cgroup.procs")
	wrapped := exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs, cmd.Path}, cmd.Args[1:]...)...)
	wrapped.Env = cmd.Env
	wrapped.Dir = cmd.Dir
	return wrapped
}

// dropFromPageCache writes the file's dirty pages, then asks the kernel
// to drop its clean pages from the page cache.
func dropFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if err := f.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// charged is what the group is charged now: all of it, and its page
// cache.
func (g *memoryCgroup) charged() (all, cache int64) {
	file := "memory.usage_in_bytes"
	cacheField := "cache"
	if g.v2 {
		file, cacheField = "memory.current", "file"
	}
	all, _ = strconv.ParseInt(g.read(file), 10, 64)
	for _, line := range strings.Split(g.read("memory.stat"), "\n") {
		if v, ok := strings.CutPrefix(line, cacheField+" "); ok {
			cache, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return all, cache
}

func (g *memoryCgroup) read(file string) string {
	b, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

func (g *memoryCgroup) limit() (int64, bool) {
	file := "memory.limit_in_bytes"
	if g.v2 {
		file = "memory.max"
	}
	n, err := strconv.ParseInt(g.read(file), 10, 64)
	return n, err == nil
}

// peak is the most the kernel has charged the group, page cache and
// kernel memory included; -1 when the kernel does not say (cgroup v2
// before Linux 5.19).
func (g *memoryCgroup) peak() int64 {
	file := "memory.max_usage_in_bytes"
	if g.v2 {
		file = "memory.peak"
	}
	n, err := strconv.ParseInt(g.read(file), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// kernelPeak is the most kernel memory charged to the group (cgroup v1);
// -1 when not accounted apart.
func (g *memoryCgroup) kernelPeak() int64 {
	n, err := strconv.ParseInt(g.read("memory.kmem.max_usage_in_bytes"), 10, 64)
	if err != nil || g.v2 {
		return -1
	}
	return n
}

// ooms is how many processes the out-of-memory killer has killed in the
// group, and how many times the group reached its limit (it then
// reclaimed, from page cache first).
func (g *memoryCgroup) ooms() (kills, reached int64) {
	field := func(text, name string) int64 {
		for _, line := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	if g.v2 {
		ev := g.read("memory.events")
		return field(ev, "oom_kill"), field(ev, "max")
	}
	n, _ := strconv.ParseInt(g.read("memory.failcnt"), 10, 64)
	return field(g.read("memory.oom_control"), "oom_kill"), n
}
