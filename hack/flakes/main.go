// Command flakes runs the suites whose assertions depend on time or on the
// order of concurrent events N times each while busy loops load the
// machine, and reports, for every test and spec that ran, how many runs it
// failed. It is `make test-flakes` (CONTRIBUTING.md).
//
// Each line of the suites file names a package and, optionally, arguments
// for its test binary (a -test.run or -ginkgo.focus to narrow it):
//
//	./test/faults
//	./sidecar/store/redisstore -test.run=Fault
//
// Every package is compiled once, with the flags make test uses, and its
// binary run in the package's directory, as go test would. A Ginkgo suite
// reports its specs through -ginkgo.json-report; any other package its
// tests and subtests through test2json. A test that was skipped is
// reported as skipped, never as passed.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	var o options
	flag.IntVar(&o.rounds, "n", 5, "how many times to run every suite")
	flag.IntVar(&o.busy, "busy", 2, "busy loops to run beside the suites, each a process spinning on the CPU")
	flag.StringVar(&o.suites, "suites", "hack/flakes/suites.txt", "the suites file: a package per line, then arguments for its test binary")
	flag.StringVar(&o.buildFlags, "build-flags", "-race", "flags for go test -c")
	flag.StringVar(&o.work, "work", "", "where the test binaries and reports go (default: a new temporary directory)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "the bound on one run of one suite")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "flakes:", err)
		os.Exit(1)
	}
}

type options struct {
	rounds, busy int
	suites       string
	buildFlags   string
	work         string
	timeout      time.Duration
}

// suite is one line of the suites file.
type suite struct {
	pkg    string   // as written, e.g. ./test/faults
	args   []string // for the test binary
	dir    string   // the package's directory
	ginkgo bool
	binary string
}

// result counts one test's or spec's outcomes over the rounds.
type result struct {
	runs, failed, skipped int
	lastFailure           string
}

func run(o options, out io.Writer) error {
	if o.rounds < 1 {
		return errors.New("-n must be at least 1")
	}
	suites, err := readSuites(o.suites)
	if err != nil {
		return err
	}
	if o.work == "" {
		if o.work, err = os.MkdirTemp("", "floodgate-flakes-"); err != nil {
			return err
		}
	}
	for i := range suites {
		if err := build(&suites[i], o, i); err != nil {
			return err
		}
	}
	stop, err := startBusyLoops(o.busy)
	if err != nil {
		return err
	}
	defer stop()
	// An interrupt ends the busy loops too; the suites' own processes are
	// reaped by hack/with-reaper.sh, which make test-flakes runs this under.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; stop(); os.Exit(130) }()

	results := map[string]*result{}
	start := time.Now()
	for round := 1; round <= o.rounds; round++ {
		for i := range suites {
			s := &suites[i]
			began := time.Now()
			failed, err := runOnce(s, o, round, results)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(out, "round %d/%d %s: %d failed, %v (load average %s)\n", round, o.rounds, s.pkg, failed,
				time.Since(began).Round(time.Second), loadAverage()); err != nil {
				return err
			}
		}
	}
	return report(out, results, o, suites, time.Since(start))
}

func readSuites(path string) ([]suite, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []suite
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		out = append(out, suite{pkg: fields[0], args: fields[1:]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s lists no suites", path)
	}
	return out, nil
}

// build compiles s's test binary and finds its directory and whether it is
// a Ginkgo suite.
func build(s *suite, o options, i int) error {
	// A package of a module of its own (the Go client's) is listed and
	// built from that module's directory.
	mod, rel := moduleOf(s.pkg)
	list := exec.Command("go", "list", "-f", "{{.Dir}}\t{{.ImportPath}}\t{{.TestImports}} {{.XTestImports}}", rel)
	list.Dir = mod
	listed, err := list.Output()
	if err != nil {
		return fmt.Errorf("go list %s: %w", s.pkg, stderrOf(err))
	}
	parts := strings.SplitN(strings.TrimSpace(string(listed)), "\t", 3)
	if len(parts) != 3 {
		return fmt.Errorf("go list %s: unexpected output %q", s.pkg, listed)
	}
	s.dir = parts[0]
	s.ginkgo = strings.Contains(parts[2], "github.com/onsi/ginkgo/v2")
	s.binary = filepath.Join(o.work, fmt.Sprintf("%02d-%s.test", i, filepath.Base(parts[1])))
	args := append([]string{"test", "-c", "-o", s.binary}, strings.Fields(o.buildFlags)...)
	cmd := exec.Command("go", append(args, rel)...)
	cmd.Dir = mod
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s: %w", s.pkg, err)
	}
	return nil
}

// moduleOf returns the directory of the module that holds the package
// directory pkg (the nearest go.mod at or above it, "." for the main
// module), and pkg relative to it.
func moduleOf(pkg string) (dir, rel string) {
	clean := filepath.Clean(strings.TrimSuffix(pkg, "/..."))
	for d := clean; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			r, err := filepath.Rel(d, clean)
			if err != nil {
				break
			}
			return d, "./" + filepath.ToSlash(r) + strings.TrimPrefix(pkg, strings.TrimSuffix(pkg, "/..."))
		}
	}
	return ".", pkg
}

// startBusyLoops starts n processes that spin on the CPU, and returns what
// stops them.
func startBusyLoops(n int) (func(), error) {
	var procs []*exec.Cmd
	stop := func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
		procs = nil
	}
	for range n {
		p := exec.Command("sh", "-c", "while :; do :; done")
		if err := p.Start(); err != nil {
			stop()
			return nil, err
		}
		procs = append(procs, p)
	}
	return stop, nil
}

// runOnce runs s once, adds its outcomes to results, and returns how many
// of its tests or specs failed.
func runOnce(s *suite, o options, round int, results map[string]*result) (int, error) {
	args := append([]string{"-test.count=1", "-test.timeout=" + o.timeout.String()}, s.args...)
	report := filepath.Join(o.work, fmt.Sprintf("%s-round%d.json", filepath.Base(s.binary), round))
	log := filepath.Join(o.work, fmt.Sprintf("%s-round%d.log", filepath.Base(s.binary), round))
	var cmd *exec.Cmd
	if s.ginkgo {
		args = append(args, "-ginkgo.json-report="+report, "-ginkgo.no-color")
		cmd = exec.Command(s.binary, args...)
	} else {
		cmd = exec.Command("go", append([]string{"tool", "test2json", "-t", "-p", s.pkg, s.binary, "-test.v=test2json"}, args...)...)
	}
	cmd.Dir = s.dir
	f, err := os.Create(log)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	cmd.Stdout, cmd.Stderr = f, f
	runErr := cmd.Run()
	var outcomes map[string]outcome
	if s.ginkgo {
		outcomes, err = ginkgoOutcomes(report)
	} else {
		outcomes, err = test2jsonOutcomes(log)
	}
	if err != nil && runErr == nil {
		return 0, fmt.Errorf("%s round %d: %w", s.pkg, round, err)
	}
	failed := 0
	for name, oc := range outcomes {
		r := results[s.pkg+" "+name]
		if r == nil {
			r = &result{}
			results[s.pkg+" "+name] = r
		}
		r.runs++
		switch oc.state {
		case "fail":
			r.failed++
			failed++
			r.lastFailure = fmt.Sprintf("round %d (%s): %s", round, log, oc.message)
		case "skip":
			r.skipped++
		}
	}
	if runErr != nil && failed == 0 {
		// The binary failed with no test or spec failing: a crash, a
		// timeout, a failure outside any test. Count it against the suite.
		r := results[s.pkg+" (the test binary)"]
		if r == nil {
			r = &result{}
			results[s.pkg+" (the test binary)"] = r
		}
		r.runs++
		r.failed++
		r.lastFailure = fmt.Sprintf("round %d: %v; see %s", round, runErr, log)
		failed++
	}
	return failed, nil
}

// outcome is one test's or spec's end: pass, fail or skip.
type outcome struct {
	state, message string
}

// test2jsonOutcomes reads the outcome of every test and subtest from a
// test2json stream.
func test2jsonOutcomes(path string) (map[string]outcome, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]outcome{}
	lastOutput := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "output":
			if t := strings.TrimSpace(ev.Output); t != "" && !strings.HasPrefix(t, "---") && !strings.HasPrefix(t, "===") {
				lastOutput[ev.Test] = t
			}
		case "pass", "fail", "skip":
			out[ev.Test] = outcome{state: ev.Action, message: lastOutput[ev.Test]}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no test reported an outcome in %s", path)
	}
	return out, nil
}

// ginkgoOutcomes reads the outcome of every spec, and of every setup node
// that failed, from a Ginkgo JSON report.
func ginkgoOutcomes(path string) (map[string]outcome, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			Failure                 struct {
				Message  string
				Location struct {
					FileName   string
					LineNumber int
				}
			}
		}
	}
	if err := json.Unmarshal(b, &suites); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]outcome{}
	for _, s := range suites {
		for _, r := range s.SpecReports {
			name := strings.Join(append(slices.Clone(r.ContainerHierarchyTexts), r.LeafNodeText), " ")
			if r.LeafNodeType != "It" {
				if r.State == "passed" {
					continue
				}
				name = "[" + r.LeafNodeType + "] " + name
			}
			var oc outcome
			switch r.State {
			case "passed":
				oc.state = "pass"
			case "skipped", "pending":
				oc.state = "skip"
			default: // failed, panicked, timedout, interrupted, aborted
				oc.state = "fail"
				msg, _, _ := strings.Cut(r.Failure.Message, "\n")
				oc.message = fmt.Sprintf("%s (%s at %s:%d)", msg, r.State, filepath.Base(r.Failure.Location.FileName), r.Failure.Location.LineNumber)
			}
			out[strings.TrimSpace(name)] = oc
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no spec reported an outcome in %s", path)
	}
	return out, nil
}

func report(w io.Writer, results map[string]*result, o options, suites []suite, took time.Duration) error {
	out := &strings.Builder{}
	names := make([]string, 0, len(results))
	total, failed, skipped := 0, 0, 0
	for name, r := range results {
		names = append(names, name)
		total += r.runs
		failed += r.failed
		skipped += r.skipped
	}
	slices.Sort(names)
	fmt.Fprintf(out, "\n%d suites, %d rounds, %d busy loops, %v; work directory %s\n", len(suites), o.rounds, o.busy, took.Round(time.Second), o.work)
	fmt.Fprintf(out, "%-8s %-8s %-8s %s\n", "runs", "failed", "skipped", "test or spec")
	for _, name := range names {
		r := results[name]
		fmt.Fprintf(out, "%-8d %-8d %-8d %s\n", r.runs, r.failed, r.skipped, name)
	}
	fmt.Fprintf(out, "\n%d outcomes, %d failed, %d skipped\n", total, failed, skipped)
	if failed == 0 {
		_, err := io.WriteString(w, out.String())
		return err
	}
	fmt.Fprintln(out, "\nfailures:")
	for _, name := range names {
		if r := results[name]; r.failed > 0 {
			fmt.Fprintf(out, "%s: failed %d of %d; last %s\n", name, r.failed, r.runs, r.lastFailure)
		}
	}
	if _, err := io.WriteString(w, out.String()); err != nil {
		return err
	}
	return fmt.Errorf("%d failures", failed)
}

// stderrOf adds a command's stderr to its error.
func stderrOf(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// loadAverage is the one-minute load average, for the report.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}
