package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/describe"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/load"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/policies"
)

// ExplainReport is explain's JSON output.
type ExplainReport struct {
	// From says what was explained: "RateLimitPolicy" or a config format.
	From     string            `json:"from"`
	Sources  []string          `json:"sources"`
	Policies []describe.Policy `json:"policies"`
	// Warnings are the notes of an envoyproxy/ratelimit conversion.
	Warnings []string `json:"warnings,omitempty"`
	// Notes say, for RateLimitPolicies compiled with
	// ClusterRateLimitPolicies, whether each rule named as a cluster
	// default replaces it (it tightens it) or not, and why.
	Notes []string `json:"notes,omitempty"`
}

// compileFlags are the flags of the verbs that compile their input.
type compileFlags struct {
	files    []string
	replicas int32
	mountDir string
}

func (f *compileFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringSliceVarP(&f.files, "filename", "f", nil, "file, directory or - (also as arguments)")
	cmd.Flags().Int32Var(&f.replicas, "replicas", 0, "replicas the policies run on, which sets each one's fail-open share (limit / replicas); default: a sidecar config's own count, 1 for RateLimitPolicies")
	cmd.Flags().StringVar(&f.mountDir, "mount-dir", "", "local directory holding the JWT keys a policy references, laid out as the sidecar mounts them (secrets/NAME/KEY, configmaps/NAME/KEY)")
}

func (f *compileFlags) compile(o *options, args []string) (*policies.Set, error) {
	return f.compileFor(o, args, nil)
}

// compileFor compiles the input for a pod with podLabels, or for every
// pod when podLabels is nil.
func (f *compileFlags) compileFor(o *options, args []string, podLabels labels.Set) (*policies.Set, error) {
	paths := append(f.files, args...)
	if len(paths) == 0 {
		return nil, errors.New("give at least one file")
	}
	if f.replicas < 0 {
		return nil, fmt.Errorf("--replicas %d: must be positive", f.replicas)
	}
	v, err := validator()
	if err != nil {
		return nil, err
	}
	docs, err := load.Read(paths, o.streams.In)
	if err != nil {
		return nil, err
	}
	return policies.Compile(docs, v, policies.Options{Namespace: o.namespace(), Replicas: f.replicas, MountDir: f.mountDir, PodLabels: podLabels})
}

func newExplain(o *options) *cobra.Command {
	var cf compileFlags
	cmd := &cobra.Command{
		Use:   "explain [-f] FILE...",
		Short: "Say what each rule limits, in words",
		Long: `explain says, for every rule, which requests it applies to, what it counts them per,
how many it admits per how long, what a request costs, what a request without the key
gets, and what happens when the counter store is unreachable.

The input is RateLimitPolicies of one namespace and ClusterRateLimitPolicies, each taken to
select that namespace (validated as admission would, then compiled by floodgate's policy
compiler), a floodgate sidecar config, or an envoyproxy/ratelimit config.`,
		Example: `  kubectl floodgate explain config/samples/ratelimit_v1alpha1_ratelimitpolicy_per_user.yaml
  kubectl floodgate explain policy.yaml --replicas 5
  kubectl floodgate explain envoy-ratelimit.yaml -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := cf.compile(o, args)
			if err != nil {
				return err
			}
			ps, err := describe.Config(set.Config)
			if err != nil {
				return err
			}
			rep := ExplainReport{From: set.From, Sources: set.Sources, Policies: ps, Notes: set.Notes}
			if set.Mapping != nil {
				rep.Warnings = set.Mapping.Warnings
			}
			if o.output == OutputJSON {
				return o.json(rep)
			}
			printExplain(o, rep, cf.replicas == 0)
			return nil
		},
	}
	cf.add(cmd)
	return cmd
}

func printExplain(o *options, rep ExplainReport, defaultReplicas bool) {
	o.printf("%s from %s\n", rep.From, strings.Join(rep.Sources, ", "))
	if defaultReplicas && rep.From == policies.FromRateLimitPolicies {
		o.printf("(fail-open shares computed for 1 replica; give --replicas for your fleet)\n")
	}
	for _, p := range rep.Policies {
		ns := ""
		if p.Namespace != "" {
			ns = ", namespace " + p.Namespace
		}
		o.printf("\npolicy %s%s: enforced by %s\n", p.Name, ns, p.Selects)
		for _, r := range p.Rules {
			o.printf("  rule %s\n", r.Name)
			o.printf("    limits   %s\n", r.Summary)
			o.printf("    applies  to %s\n", r.Applies)
			if r.Cost != "" {
				o.printf("    cost     %s\n", r.Cost)
			}
			if r.MissingKey != "" {
				o.printf("    missing  %s\n", r.MissingKey)
			}
			if r.Exempt != "" {
				o.printf("    exempt   %s\n", r.Exempt)
			}
			if len(r.ReplacedBy) > 0 {
				o.printf("    replaced on the pods of %s, whose own rule tightens it\n", strings.Join(r.ReplacedBy, ", "))
			}
		}
	}
	for _, n := range rep.Notes {
		o.printf("\nnote: %s\n", n)
	}
	for _, w := range rep.Warnings {
		o.printf("\nwarning: %s\n", w)
	}
}
