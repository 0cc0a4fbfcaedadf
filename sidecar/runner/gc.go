package runner

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
)

// Defaults of the garbage-collector flags. A sidecar's live heap is small
// (a few MiB) and every request allocates, so with Go's default GOGC of 100
// the collector runs about ten times a second at a few thousand requests a
// second, and a request that arrives during a mark phase waits for the
// collector's share of the CPU. Side by side on one core, GOGC=400 gave a
// p99 of 7-8 ms against 14-18 ms at 11,800 requests/s, and 0.9-1.3 ms
// against 1.2-2.5 ms at 6,000/s. The memory limit keeps that from
// ever costing an out-of-memory kill: near it the collector runs as often
// as it must. It is 0.75 of the container's limit, not more, because the
// container's limit also holds what the runtime does not count: the
// binary's pages (about 40 MiB) and the kernel's memory for the sockets
// (about 15 MiB at 10,000 connections). Under 10,000 hostile connections
// in a 256Mi cgroup, 0.9 needed 275 MiB resident in all, and the kernel
// reclaimed the sidecar's own code from under it; 0.75 needed 241 MiB
// (TestHostileConnectionsRSS).
const (
	DefaultGCPercent        = 400
	DefaultMemoryLimitRatio = 0.75
)

// cgroupMemoryFiles are where the container's memory limit is read:
// cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// GCSettings is what the sidecar sets in the Go garbage collector, and why.
type GCSettings struct {
	// Percent is GOGC; 0 when the GOGC environment variable decides.
	Percent int
	// MemoryLimit is the soft memory limit in bytes; 0 when none is set
	// here (GOMEMLIMIT decides, or there is no container limit).
	MemoryLimit int64
	// Why says where each setting came from, for the startup log.
	Why string
}

// PlanGC decides the collector's settings from the flags, the environment
// and the container's memory limit (read by containerLimit, which reports
// false when there is none). It does not apply them.
func PlanGC(c Config, getenv func(string) (string, bool), containerLimit func() (int64, bool)) GCSettings {
	var g GCSettings
	if v, ok := getenv("GOGC"); ok {
		g.Why = "GOGC=" + v + " from the environment"
	} else {
		g.Percent = c.GCPercent
		g.Why = fmt.Sprintf("GOGC=%d (--gc-percent)", c.GCPercent)
	}
	switch v, ok := getenv("GOMEMLIMIT"); {
	case ok:
		g.Why += "; GOMEMLIMIT=" + v + " from the environment"
	case c.MemoryLimitRatio == 0:
		g.Why += "; no memory limit (--memory-limit-ratio 0)"
	default:
		limit, ok := containerLimit()
		if !ok {
			g.Why += "; no memory limit (the container has none)"
			break
		}
		g.MemoryLimit = int64(float64(limit) * c.MemoryLimitRatio)
		g.Why += fmt.Sprintf("; memory limit %d bytes (%.2f of the container's %d)", g.MemoryLimit, c.MemoryLimitRatio, limit)
	}
	return g
}

// ApplyGC sets g in the runtime.
func ApplyGC(g GCSettings) {
	if g.Percent > 0 {
		debug.SetGCPercent(g.Percent)
	}
	if g.MemoryLimit > 0 {
		debug.SetMemoryLimit(g.MemoryLimit)
	}
}

// ContainerMemoryLimit reads the container's memory limit from the cgroup
// files; false when there is none or it cannot be read.
func ContainerMemoryLimit() (int64, bool) {
	for _, f := range cgroupMemoryFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		return parseCgroupLimit(b)
	}
	return 0, false
}

// parseCgroupLimit parses memory.max ("max" or bytes) or v1's
// memory.limit_in_bytes (bytes; a value near 2^63 means none).
func parseCgroupLimit(b []byte) (int64, bool) {
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= math.MaxInt64/2 {
		return 0, false
	}
	return n, true
}
