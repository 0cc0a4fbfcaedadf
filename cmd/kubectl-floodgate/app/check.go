package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/admit"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/load"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// CheckResult is check's verdict on one object or config.
type CheckResult struct {
	Source   string `json:"source"`
	Document int    `json:"document"`
	// Format is "Kubernetes manifest", "floodgate sidecar config" or
	// "envoyproxy/ratelimit config".
	Format     string `json:"format"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name,omitempty"`
	// Valid reports whether the object would be admitted, or the config
	// loaded by a sidecar.
	Valid bool `json:"valid"`
	// Skipped marks a manifest that is not a floodgate object.
	Skipped bool `json:"skipped,omitempty"`
	// Message is the error as kubectl apply would print it (for a
	// manifest) or as the sidecar reports it (for a config).
	Message string `json:"message,omitempty"`
	// Status is the API server's answer to a rejected manifest.
	Status *metav1.Status `json:"status,omitempty"`
	// Summary describes a valid config.
	Summary string `json:"summary,omitempty"`
}

// CheckReport is check's JSON output.
type CheckReport struct {
	Results []CheckResult `json:"results"`
	Valid   int           `json:"valid"`
	Invalid int           `json:"invalid"`
	Skipped int           `json:"skipped"`
}

func newCheck(o *options) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "check [-f] FILE...",
		Short: "Validate policies as admission would, offline",
		Long: `check validates RateLimitPolicies and CounterStores exactly as a kubectl apply would be judged:
the CRD's OpenAPI schema and CEL rules, run by the API server's own code, then floodgate's
validating webhook. It needs no cluster, and prints kubectl's own messages.

It also validates floodgate sidecar configs and envoyproxy/ratelimit configs as the sidecar
loads them. Other objects in the files are skipped. A directory means its .yaml, .yml and
.json files; - means standard input.

Exit code 1 when any object is invalid.`,
		Example: `  kubectl floodgate check config/samples/
  kubectl floodgate check -n shop policy.yaml -o json
  helm template charts/app | kubectl floodgate check -`,
		RunE: func(cmd *cobra.Command, args []string) error {
			paths := append(files, args...)
			if len(paths) == 0 {
				return errors.New("check: give at least one file")
			}
			return runCheck(o, paths)
		},
	}
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "file, directory or - to check (also as arguments)")
	return cmd
}

func runCheck(o *options, paths []string) error {
	v, err := validator()
	if err != nil {
		return err
	}
	docs, err := load.Read(paths, o.streams.In)
	if err != nil {
		return err
	}
	ns := o.namespace()
	var rep CheckReport
	for i := range docs {
		r := checkDoc(v, &docs[i], ns)
		switch {
		case r.Skipped:
			rep.Skipped++
		case r.Valid:
			rep.Valid++
		default:
			rep.Invalid++
		}
		rep.Results = append(rep.Results, r)
	}
	if o.output == OutputJSON {
		if err := o.json(rep); err != nil {
			return err
		}
	} else {
		for _, r := range rep.Results {
			printCheck(o, r)
		}
		o.printf("%d valid, %d invalid, %d skipped (not floodgate objects)\n", rep.Valid, rep.Invalid, rep.Skipped)
	}
	if rep.Invalid > 0 {
		return errFindings
	}
	return nil
}

func printCheck(o *options, r CheckResult) {
	where := r.Source
	if r.Document > 1 {
		where = fmt.Sprintf("%s (document %d)", r.Source, r.Document)
	}
	what := r.Format
	if r.Kind != "" {
		what = strings.ToLower(r.Kind) + "/" + r.Name
		if g := groupOf(r.APIVersion); g != "" {
			what = strings.ToLower(r.Kind) + "." + g + "/" + r.Name
		}
	}
	switch {
	case r.Skipped:
		o.printf("%s: %s skipped: not a floodgate object\n", where, what)
	case r.Valid && r.Summary != "":
		o.printf("%s: %s valid: %s\n", where, what, r.Summary)
	case r.Valid:
		o.printf("%s: %s valid\n", where, what)
	default:
		o.printf("%s: %s invalid\n  %s\n", where, what, strings.ReplaceAll(r.Message, "\n", "\n  "))
	}
}

func groupOf(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}

func checkDoc(v *admit.Validator, d *load.Doc, namespace string) CheckResult {
	r := CheckResult{Source: d.Source, Document: d.Index, Format: d.Format.String()}
	if d.Format != load.Manifest {
		return checkConfig(d, r)
	}
	r.APIVersion, r.Kind, r.Name, r.Namespace = d.GVK.GroupVersion().String(), d.GVK.Kind, d.Name, d.Namespace
	if !v.Groups()[d.GVK.Group] {
		r.Skipped = true
		return r
	}
	if r.Namespace == "" && v.Namespaced(d.GVK) {
		r.Namespace = namespace
	}
	u, err := v.Create(d.JSON, namespace)
	if err == nil {
		r.Valid, r.Name, r.Namespace = true, u.GetName(), u.GetNamespace()
		return r
	}
	var se *apierrors.StatusError
	switch {
	case errors.As(err, &se):
		st := se.Status()
		r.Status = &st
		r.Message = kubectlMessage(err, d.Source)
	case errors.Is(err, admit.ErrUnknownKind):
		r.Message = fmt.Sprintf("resource mapping not found for name: %q namespace: %q from %q: %v\nensure CRDs are installed first", d.Name, d.Namespace, d.Source, err)
	default:
		r.Message = err.Error()
	}
	return r
}

// checkConfig loads a sidecar or envoyproxy/ratelimit config as the
// sidecar does, and compiles every policy of it whatever pods it selects.
func checkConfig(d *load.Doc, r CheckResult) CheckResult {
	c, _, _, err := rlsimport.LoadAny(d.Data, rlsimport.Options{})
	if err != nil {
		r.Message = err.Error()
		return r
	}
	all := *c
	all.Policies = append([]config.Policy(nil), c.Policies...)
	for i := range all.Policies {
		all.Policies[i].PodSelector = nil
	}
	set, err := ruleset.Compile(&all, nil, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		r.Message = "does not compile: " + err.Error()
		return r
	}
	r.Valid = true
	r.Summary = fmt.Sprintf("%d policies, %s, %d Envoy descriptor rules in %d domains",
		len(c.Policies), rlsimport.HTTPRules(len(set.Rules), len(set.Concurrency)), len(set.Descriptors.Rules()), set.Descriptors.Domains())
	return r
}
