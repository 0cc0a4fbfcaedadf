package app

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/clusterstatus"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func newStatus(o *options) *cobra.Command {
	var window, timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status [POLICY]",
		Short: "Show which pods enforce which revision, the store, and recent denials",
		Long: `status shows, for a RateLimitPolicy (or every one of the namespace): its conditions, the
revision of the namespace's compiled config (ConfigMap ` + config.ConfigMapName + `), the CounterStore's state,
each targeted pod with the revision its sidecar enforces (stale when it is not the current
one), and what the sidecars decided per rule, in total and over the last --window.
For a policy with a targetRef, which the central rate-limit service enforces: its
target, the service's replicas that have loaded it, and the gateway objects the
manager applied (status.target.appliedObjects), with their state.

It reads the API and the sidecars' metrics, through the API server's pod proxy: it needs
get/list on ratelimitpolicies, counterstores, pods and configmaps, and get on pods/proxy.

Exit code 1 when something is not right: a condition that is not True, a generation not yet
compiled, a targeted pod that is stale, a target not found, a gateway object Rejected,
in Conflict or NotInstalled.`,
		Example: `  kubectl floodgate status -n shop
  kubectl floodgate status checkout -n shop --window 30s
  kubectl floodgate status checkout -n shop -o json --window 0`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			policy := ""
			if len(args) == 1 {
				policy = args[0]
			}
			return runStatus(cmd.Context(), o, policy, window, timeout)
		},
	}
	cmd.Flags().DurationVar(&window, "window", 5*time.Second, "read the sidecars' metrics twice, this far apart, to show recent decisions; 0 shows totals only")
	cmd.Flags().DurationVar(&timeout, "scrape-timeout", 5*time.Second, "bound on reading one sidecar's metrics")
	return cmd
}

func runStatus(ctx context.Context, o *options, policy string, window, timeout time.Duration) error {
	if ctx == nil {
		ctx = context.Background()
	}
	rc, err := o.kube.ToRESTConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	in, err := clusterstatus.Gather(ctx, clusterstatus.Sources{Reader: c, Pods: cs.CoreV1()},
		clusterstatus.Options{Namespace: o.namespace(), Policy: policy, Window: window, ScrapeTimeout: timeout})
	if err != nil {
		return err
	}
	rep := clusterstatus.Build(in)
	if o.output == OutputJSON {
		if err := o.json(rep); err != nil {
			return err
		}
	} else {
		printStatus(o, rep)
	}
	if len(rep.Problems) > 0 {
		return errFindings
	}
	return nil
}

func printStatus(o *options, rep clusterstatus.Report) {
	if len(rep.Policies) == 0 {
		o.printf("no RateLimitPolicy in namespace %s\n", rep.Namespace)
	}
	recent := ""
	if rep.Window != "" {
		recent = "last " + rep.Window
	}
	for i, p := range rep.Policies {
		if i > 0 {
			o.printf("\n")
		}
		o.printf("RateLimitPolicy %s/%s (generation %d)\n", rep.Namespace, p.Name, p.Generation)
		tw := tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
		for _, c := range p.Conditions {
			msg := c.Reason
			if c.Message != "" {
				msg += ": " + c.Message
			}
			fprintf(tw, "  %s\t%s\t%s\n", c.Type, c.Status, msg)
		}
		switch {
		case p.Target != nil:
			// Compiled into the central service's document, in the
			// manager's namespace: Programmed says how that went.
		case p.Revision != "":
			fprintf(tw, "  compiled\t\trevision %s in ConfigMap %s, generation %d\n", p.Revision, config.ConfigMapName, p.CompiledGeneration)
		default:
			fprintf(tw, "  compiled\t\tno ConfigMap %s in the namespace\n", config.ConfigMapName)
		}
		store := p.Store.Name + ": "
		switch {
		case !p.Store.Found:
			store += p.Store.Message
		default:
			store += "Ready " + or(p.Store.Ready, "Unknown") + ", Degraded " + or(p.Store.Degraded, "Unknown")
			if len(p.Store.Endpoints) > 0 {
				store += "; endpoints " + strings.Join(p.Store.Endpoints, ", ")
			}
			if p.Store.Message != "" {
				store += "; " + p.Store.Message
			}
		}
		fprintf(tw, "  store\t\t%s\n", store)
		if p.Target != nil {
			printStatusTarget(o, tw, p)
			continue
		}
		fprintf(tw, "  pods\t\t%d of %d targeted pods enforce the current revision\n", p.Enforcing, p.Targeted)
		_ = tw.Flush()

		if len(p.Pods) > 0 {
			o.printf("\n")
			tw = tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
			fprintf(tw, "  POD\tREADY\tENFORCES\tSIDECAR METRICS\n")
			for _, pod := range p.Pods {
				fprintf(tw, "  %s\t%v\t%s\t%s\n", pod.Name, pod.Ready, enforces(pod), podMetrics(pod, recent))
			}
			_ = tw.Flush()
		}
		if len(p.Rules) > 0 {
			o.printf("\n")
			tw = tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
			if recent == "" {
				fprintf(tw, "  RULE\tALLOWED\tDENIED\tSHADOW DENIED\tUNAVAILABLE\tEXEMPT\n")
			} else {
				fprintf(tw, "  RULE\tALLOWED\tDENIED\tSHADOW DENIED\tUNAVAILABLE\tEXEMPT\tALLOWED (%s)\tDENIED (%s)\n", recent, recent)
			}
			for _, r := range p.Rules {
				fprintf(tw, "  %s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f", r.Rule, r.Allowed, r.Denied, r.ShadowDenied, r.Unavailable, r.Exempt)
				if recent != "" {
					fprintf(tw, "\t%.0f\t%.0f", r.RecentAllowed, r.RecentDenied)
				}
				fprintf(tw, "\n")
			}
			_ = tw.Flush()
		}
	}
	if len(rep.Problems) > 0 {
		o.printf("\nproblems:\n")
		for _, p := range rep.Problems {
			o.printf("  - %s\n", p)
		}
	}
}

// printStatusTarget prints, for a policy with a targetRef, its target,
// the central service's replicas, and the gateway objects the manager
// applied, then flushes tw.
func printStatusTarget(o *options, tw *tabwriter.Writer, p clusterstatus.PolicyStatus) {
	t := p.Target
	fprintf(tw, "  target\t\t%s\n", targetSummary(t.Ref, t))
	fprintf(tw, "  enforced by\t\t%s replicas of the central rate-limit service have loaded it\n", or(p.ServiceReplicas, "0/0"))
	if len(t.GatewayConfig) > 0 {
		fprintf(tw, "  gateway config\t\t%s\n", gatewayConfigKeys(t.GatewayConfig))
	}
	if len(t.AppliedObjects) == 0 {
		fprintf(tw, "  applied\t\tnone reported\n")
	}
	_ = tw.Flush()
	if len(t.AppliedObjects) == 0 {
		return
	}
	o.printf("\n")
	tw = tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
	fprintf(tw, "  APPLIED\tGATEWAY\tSTATE\tMESSAGE\n")
	for _, a := range t.AppliedObjects {
		fprintf(tw, "  %s %s/%s\t%s\t%s\t%s\n", a.Kind, a.Namespace, a.Name, a.Gateway, a.State, a.Message)
	}
	_ = tw.Flush()
}

func enforces(p clusterstatus.PodStatus) string {
	switch {
	case !p.Sidecar:
		return "no sidecar"
	case p.Enforces:
		return p.LoadedMessage
	case p.LoadedReason == "":
		return "not reported"
	case p.LoadedReason == config.ReasonLoaded:
		return p.LoadedMessage + " (stale)"
	}
	return p.LoadedReason + ": " + p.LoadedMessage
}

func podMetrics(p clusterstatus.PodStatus, recent string) string {
	if p.MetricsError != "" {
		return "unavailable: " + p.MetricsError
	}
	if !p.Sidecar {
		return ""
	}
	var parts []string
	if p.MetricsRevision != "" {
		parts = append(parts, "config "+p.MetricsRevision)
	}
	if p.FallbackActive {
		parts = append(parts, "FALLBACK ACTIVE (a store shard is unreachable)")
	}
	for _, r := range p.Rules {
		s := fmt.Sprintf("%s %.0f allowed, %.0f denied", r.Rule, r.Allowed, r.Denied)
		if recent != "" {
			s += fmt.Sprintf(" (%s: %.0f allowed, %.0f denied)", recent, r.RecentAllowed, r.RecentDenied)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
