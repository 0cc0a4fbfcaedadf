package runner

import (
	"strings"
	"testing"
)

func TestPlanGC(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	limit := func(n int64) func() (int64, bool) { return func() (int64, bool) { return n, n > 0 } }
	cfg := Config{GCPercent: 400, MemoryLimitRatio: 0.9}
	for _, tc := range []struct {
		name      string
		cfg       Config
		getenv    func(string) (string, bool)
		container int64
		percent   int
		memLimit  int64
		why       string
	}{
		{"flags and a container limit", cfg, env(), 256 << 20, 400, 241591910, "GOGC=400 (--gc-percent); memory limit 241591910 bytes"},
		{"no container limit", cfg, env(), 0, 400, 0, "no memory limit (the container has none)"},
		{"GOGC wins", cfg, env("GOGC", "150"), 256 << 20, 0, 241591910, "GOGC=150 from the environment"},
		{"GOMEMLIMIT wins", cfg, env("GOMEMLIMIT", "100MiB"), 256 << 20, 400, 0, "GOMEMLIMIT=100MiB from the environment"},
		{"ratio 0 sets none", Config{GCPercent: 100}, env(), 256 << 20, 100, 0, "no memory limit (--memory-limit-ratio 0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := PlanGC(tc.cfg, tc.getenv, limit(tc.container))
			if got, want := g.Percent, tc.percent; got != want {
				t.Errorf("Percent = %d, want %d", got, want)
			}
			if got, want := g.MemoryLimit, tc.memLimit; got != want {
				t.Errorf("MemoryLimit = %d, want %d", got, want)
			}
			if !strings.Contains(g.Why, tc.why) {
				t.Errorf("Why = %q, want it to contain %q", g.Why, tc.why)
			}
		})
	}
}

func TestParseCgroupLimit(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"268435456\n":           268435456,
		"max\n":                 0,
		"9223372036854771712\n": 0, // cgroup v1: no limit
		"":                      0,
		"-1":                    0,
		"lots":                  0,
	} {
		got, ok := parseCgroupLimit([]byte(in))
		if got != want || ok != (want > 0) {
			t.Errorf("parseCgroupLimit(%q) = %d, %v; want %d, %v", in, got, ok, want, want > 0)
		}
	}
}
