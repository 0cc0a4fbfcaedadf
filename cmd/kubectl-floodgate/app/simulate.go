package app

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/sim"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/trace"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
)

// DefaultStart is the simulated clock's time at offset 0 of a trace that
// gives offsets, and of a synthetic load.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// SimulateReport is simulate's JSON output.
type SimulateReport struct {
	From    string   `json:"from"`
	Sources []string `json:"sources"`
	// Start is the simulated clock's time at offset 0.
	Start time.Time `json:"start"`
	// Rules and ConcurrencyRules are the numbers of rate rules and of
	// concurrency rules in force; IgnoredPolicies are the policies whose
	// podSelector does not select --pod-labels.
	Rules            int      `json:"rules"`
	ConcurrencyRules int      `json:"concurrencyRules,omitempty"`
	IgnoredPolicies  []string `json:"ignoredPolicies,omitempty"`
	// DescriptorRules apply only to Envoy's rate-limit calls and are not
	// simulated.
	DescriptorRules int            `json:"descriptorRules,omitempty"`
	Decisions       []sim.Decision `json:"decisions"`
	Summary         []SimSummary   `json:"summary"`
}

// SimSummary counts the outcomes of the requests of one binding rule
// ("policy.rule", or "" for requests no enforced rule matched).
type SimSummary struct {
	Rule     string `json:"rule"`
	Requests int    `json:"requests"`
	Allowed  int    `json:"allowed"`
	// Delayed counts the allowed requests a rule with onExceed: Delay
	// held before they went on.
	Delayed     int `json:"delayed,omitempty"`
	Denied      int `json:"denied"`
	Rejected    int `json:"rejected,omitempty"`
	Unavailable int `json:"unavailable,omitempty"`
}

type simulateFlags struct {
	compileFlags
	requests  string
	format    string
	start     string
	podLabels string
	rate      string
	duration  time.Duration
	keyFrom   []string
	method    string
	path      string
	headers   []string
	quiet     bool
	writeConf string
}

func newSimulate(o *options) *cobra.Command {
	var f simulateFlags
	cmd := &cobra.Command{
		Use:   "simulate [-f] FILE... (--requests TRACE | --rate N/s --for D)",
		Short: "Replay requests against a policy on a simulated clock",
		Long: `simulate decides requests with the sidecar's own matcher, key extraction, decision engine
and in-memory limiter, on a simulated clock, and prints each answer with the headers the
client would see: status, X-RateLimit-*, RateLimit, RateLimit-Policy, Retry-After.

The requests come from a trace (--requests FILE, or - for stdin) or a synthetic load
(--rate, --for, --key-from). A trace is one request per line:

  # time   method path          fields (Name:value headers, client=IP, host=NAME)
  0s       GET    /api/orders   X-API-Key:alice
  0.2s     GET    /api/orders   X-API-Key:alice client=10.0.0.7

or JSON lines ({"time":"0.2s","method":"GET","path":"/x","headers":{...},"client":"..."}),
or an access log: --format combined (nginx, Apache) or envoy (Envoy's default format).

Times are offsets from --start or RFC 3339 times. Every policy applies unless --pod-labels
names the pod to simulate.`,
		Example: `  kubectl floodgate simulate policy.yaml --rate 50/s --for 1m --key-from header:X-API-Key=alice
  kubectl floodgate simulate policy.yaml --requests trace.txt
  kubectl floodgate simulate policy.yaml --requests access.log --format combined --set-header X-API-Key:alice
  kubectl floodgate simulate policy.yaml --requests trace.txt -o json --write-config sidecar.json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSimulate(o, &f, args)
		},
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.requests, "requests", "", "trace of requests to replay, or - for stdin")
	fl.StringVar(&f.format, "format", trace.FormatAuto, "trace format: "+strings.Join(trace.Formats, ", "))
	fl.StringVar(&f.start, "start", DefaultStart.Format(time.RFC3339), "simulated time of offset 0 (RFC 3339)")
	fl.StringVar(&f.podLabels, "pod-labels", "", "labels of the pod to simulate, k=v,k2=v2: only the policies selecting it apply (default: every policy)")
	fl.StringVar(&f.rate, "rate", "", "synthetic load: requests per unit, such as 50/s or 3000/min")
	fl.DurationVar(&f.duration, "for", 0, "synthetic load: how long, such as 1m")
	fl.StringArrayVar(&f.keyFrom, "key-from", nil, "synthetic load: vary requests by header:NAME=v1,v2, query:NAME=v1,v2 or client=IP1,IP2 (values taken in turn; repeatable)")
	fl.StringVar(&f.method, "method", http.MethodGet, "synthetic load: the method")
	fl.StringVar(&f.path, "path", "/", "synthetic load: the path and query")
	fl.StringArrayVar(&f.headers, "set-header", nil, "add Name:value to every request (repeatable)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "text output: print only the summary")
	fl.StringVar(&f.writeConf, "write-config", "", "write the compiled sidecar config the simulation ran to this file (for floodgate-sidecar --policy-file)")
	return cmd
}

func runSimulate(o *options, f *simulateFlags, args []string) error {
	start, err := time.Parse(time.RFC3339Nano, f.start)
	if err != nil {
		return fmt.Errorf("--start: %w", err)
	}
	reqs, err := f.load(o, start)
	if err != nil {
		return err
	}
	var podLabels labels.Set
	if f.podLabels != "" {
		if podLabels, err = labels.ConvertSelectorToLabelsMap(f.podLabels); err != nil {
			return fmt.Errorf("--pod-labels: %w", err)
		}
	}
	set, err := f.compileFor(o, args, podLabels)
	if err != nil {
		return err
	}
	if set.Config == nil {
		return errors.New("every RateLimitPolicy of the input has a targetRef: a gateway enforces it through the central rate-limit service, and simulate runs the sidecar; see kubectl floodgate explain")
	}
	if f.writeConf != "" {
		data, err := compiler.Marshal(set.Config)
		if err != nil {
			return err
		}
		if err := os.WriteFile(f.writeConf, []byte(data), 0o644); err != nil {
			return err
		}
	}
	s, err := sim.New(sim.Options{Config: set.Config, PodLabels: podLabels, Start: start})
	if err != nil {
		return err
	}
	rep := SimulateReport{From: set.From, Sources: set.Sources, Start: start}
	rep.Rules, rep.IgnoredPolicies, rep.DescriptorRules = s.Rules()
	rep.ConcurrencyRules = s.ConcurrencyRules()
	sums := map[string]*SimSummary{}
	for _, r := range reqs {
		d, err := s.Do(r)
		if err != nil {
			return err
		}
		rep.Decisions = append(rep.Decisions, d)
		rule := bindingRule(d.Headers["Ratelimit"])
		sm := sums[rule]
		if sm == nil {
			sm = &SimSummary{Rule: rule}
			sums[rule] = sm
		}
		sm.Requests++
		switch d.Outcome {
		case sim.Allowed:
			sm.Allowed++
			if d.Delay != "" {
				sm.Delayed++
			}
		case sim.Denied:
			sm.Denied++
		case sim.Rejected:
			sm.Rejected++
		default:
			sm.Unavailable++
		}
	}
	for _, sm := range sums {
		rep.Summary = append(rep.Summary, *sm)
	}
	sort.Slice(rep.Summary, func(i, j int) bool { return rep.Summary[i].Rule < rep.Summary[j].Rule })
	if o.output == OutputJSON {
		return o.json(rep)
	}
	printSimulation(o, rep, f.quiet)
	return nil
}

// load reads the trace or builds the synthetic load.
func (f *simulateFlags) load(o *options, start time.Time) ([]trace.Request, error) {
	extra := http.Header{}
	for _, h := range f.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("--set-header %q: want Name:value", h)
		}
		extra.Add(name, strings.TrimSpace(value))
	}
	synthetic := f.rate != "" || f.duration > 0 || len(f.keyFrom) > 0
	switch {
	case f.requests != "" && synthetic:
		return nil, errors.New("give either --requests or a synthetic load (--rate, --for, --key-from), not both")
	case f.requests != "":
		r := o.streams.In
		if f.requests != "-" {
			file, err := os.Open(f.requests)
			if err != nil {
				return nil, err
			}
			defer func() { _ = file.Close() }()
			r = file
		}
		reqs, err := trace.Read(r, f.format, start)
		if err != nil {
			return nil, fmt.Errorf("--requests %s: %w", f.requests, err)
		}
		for i := range reqs {
			for n, vs := range extra {
				reqs[i].Header[n] = append(reqs[i].Header[n], vs...)
			}
		}
		return reqs, nil
	case synthetic:
		rate, err := trace.ParseRate(f.rate)
		if err != nil {
			return nil, err
		}
		syn := trace.Synthetic{Rate: rate, For: f.duration, Method: strings.ToUpper(f.method), Target: f.path, Header: extra}
		for _, k := range f.keyFrom {
			kf, err := trace.ParseKeyFrom(k)
			if err != nil {
				return nil, err
			}
			syn.Keys = append(syn.Keys, kf)
		}
		return syn.Requests(start)
	}
	return nil, errors.New("give the requests: --requests TRACE, or --rate and --for")
}

// bindingRule reads the rule a RateLimit field names.
func bindingRule(rl string) string {
	name, _, _ := strings.Cut(rl, ";")
	return strings.Trim(name, `"`)
}

func printSimulation(o *options, rep SimulateReport, quiet bool) {
	o.printf("%s from %s: %s", rep.From, strings.Join(rep.Sources, ", "), rlsimport.HTTPRules(rep.Rules, rep.ConcurrencyRules))
	if len(rep.IgnoredPolicies) > 0 {
		o.printf("; policies not selecting --pod-labels: %v", rep.IgnoredPolicies)
	}
	if rep.DescriptorRules > 0 {
		o.printf("; %d Envoy descriptor rules are not simulated (they apply to Envoy's rate-limit calls, not to HTTP requests)", rep.DescriptorRules)
	}
	o.printf("\n")
	if !quiet {
		tw := tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
		fprintf(tw, "\nTIME\tMETHOD\tPATH\tSTATUS\tRULE\tREMAINING\tRESET\tRETRY-AFTER\tDELAY\tREQUEST\n")
		for _, d := range rep.Decisions {
			rl := d.Headers["Ratelimit"]
			delay := d.Delay
			if delay == "" {
				delay = "-"
			}
			fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", offset(d.At.Sub(rep.Start)), d.Method, d.Target, d.Status,
				bindingRule(rl), param(rl, "r"), seconds(param(rl, "t")), seconds(d.Headers["Retry-After"]), delay, keyNote(d))
		}
		_ = tw.Flush()
	}
	o.printf("\n%-32s %9s %8s %8s %7s %9s %12s\n", "binding rule", "requests", "allowed", "delayed", "denied", "rejected", "unavailable")
	for _, s := range rep.Summary {
		rule := s.Rule
		if rule == "" {
			rule = "(no rule)"
		}
		o.printf("%-32s %9d %8d %8d %7d %9d %12d\n", rule, s.Requests, s.Allowed, s.Delayed, s.Denied, s.Rejected, s.Unavailable)
	}
}

func offset(d time.Duration) string {
	return fmt.Sprintf("%.3fs", d.Seconds())
}

// param reads a parameter of a RateLimit field's item.
func param(rl, name string) string {
	for _, p := range strings.Split(rl, ";")[1:] {
		if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && k == name {
			return v
		}
	}
	return ""
}

func seconds(s string) string {
	if s == "" {
		return ""
	}
	return s + "s"
}

// keyNote shows the request's headers, so that a reader can tell whose
// request it was.
func keyNote(d sim.Decision) string {
	var parts []string
	for n, v := range d.Request {
		parts = append(parts, n+"="+v)
	}
	sort.Strings(parts)
	if d.Client != trace.DefaultClient {
		parts = append(parts, "client="+d.Client)
	}
	return strings.Join(parts, " ")
}
