package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
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
compiler), a floodgate sidecar config, or an envoyproxy/ratelimit config.

A RateLimitPolicy with a targetRef is explained as the central rate-limit service
enforces it; when the input carries its status (kubectl get ratelimitpolicy NAME -o yaml),
explain also shows its target and the gateway objects the manager applied.`,
		Example: `  kubectl floodgate explain config/samples/ratelimit_v1alpha1_ratelimitpolicy_per_user.yaml
  kubectl floodgate explain policy.yaml --replicas 5
  kubectl floodgate explain envoy-ratelimit.yaml -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := cf.compile(o, args)
			if err != nil {
				return err
			}
			var ps []describe.Policy
			if set.Config != nil {
				if ps, err = describe.Config(set.Config); err != nil {
					return err
				}
			}
			if set.Gateway != nil {
				targets := make(map[string]describe.Target, len(set.Targets))
				for name, t := range set.Targets {
					targets[name] = describe.Target{Ref: t.Ref.String(), Status: t.Status}
				}
				gps, err := describe.Gateway(set.Gateway, targets)
				if err != nil {
					return err
				}
				ps = append(ps, gps...)
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
		if p.Target != nil {
			printExplainTarget(o, p.Name, p.Target)
		}
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

// printExplainTarget prints what the manager reported of a policy's
// target, when the input carries the policy's status.
func printExplainTarget(o *options, name string, t *describe.Target) {
	st := t.Status
	if st == nil {
		o.printf("  target   %s: no status in the input; to see what the manager found and applied, explain the policy as the cluster has it: kubectl get ratelimitpolicy %s -o yaml | kubectl floodgate explain -\n", t.Ref, name)
		return
	}
	o.printf("  target   %s\n", targetSummary(t.Ref, st))
	if len(st.GatewayConfig) > 0 {
		o.printf("  config   %s\n", gatewayConfigKeys(st.GatewayConfig))
	}
	if len(st.AppliedObjects) == 0 {
		o.printf("  applied  none reported\n")
	}
	for _, a := range st.AppliedObjects {
		o.printf("  applied  %s\n", appliedObject(a))
	}
}

// targetSummary is "HTTPRoute/api: found; Gateways shop/public; hostnames
// api.example.com".
func targetSummary(ref string, st *v1alpha1.TargetStatus) string {
	if st.Ref != "" {
		ref = st.Ref
	}
	if !st.Found {
		return ref + ": not found"
	}
	s := ref + ": found; Gateways "
	if len(st.Gateways) == 0 {
		s += "none"
	} else {
		s += strings.Join(st.Gateways, ", ")
	}
	if len(st.Hostnames) == 0 {
		return s + "; any host"
	}
	return s + "; hostnames " + strings.Join(st.Hostnames, ", ")
}

// gatewayConfigKeys names the keys of the ConfigMap that hold each
// Gateway's generated config.
func gatewayConfigKeys(keys []string) string {
	return "keys " + strings.Join(keys, ", ") + " of ConfigMap " + gatewayConfigMap
}

// gatewayConfigMap is the ConfigMap, in the central rate-limit service's
// namespace, where the manager publishes each Gateway's config.
const gatewayConfigMap = "floodgate-gateway-config"

// appliedObject is "EnvoyFilter shop/floodgate-public for Gateway
// shop/public: Applied", with the message after the state.
func appliedObject(a v1alpha1.AppliedObject) string {
	s := fmt.Sprintf("%s %s/%s for Gateway %s: %s", a.Kind, a.Namespace, a.Name, a.Gateway, a.State)
	if a.Message != "" {
		s += ": " + a.Message
	}
	return s
}
