// Package app is kubectl-floodgate's composition root: the verbs, their
// flags and output, and the exit codes.
//
//	kubectl floodgate check FILE...       validate as admission would, offline
//	kubectl floodgate explain FILE...     what each rule limits, in words
//	kubectl floodgate simulate FILE...    replay requests on a simulated clock
//	kubectl floodgate status [POLICY]     who enforces what, from the cluster
//
// Every verb takes --output text|json. The exit code is 0 when all is
// well, 1 when the verb found a problem (check: an invalid object;
// status: a policy not programmed on every targeted pod), and 2 when it
// could not do its work (unreadable input, bad flags, no cluster).
package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/admit"
	"github.com/floodgate-dev/floodgate/config/crd"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitFindings = 1
	ExitError    = 2
)

// Output formats.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// Streams are the plugin's standard streams.
type Streams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// Version is the plugin's version, set at link time by the release build
// (-ldflags "-X .../app.Version=v0.1.0").
var Version = "dev"

// errFindings is returned by a verb that ran and found problems; they are
// already printed.
var errFindings = errors.New("problems found")

// options are the flags every verb shares.
type options struct {
	streams Streams
	kube    *genericclioptions.ConfigFlags
	output  string
}

func (o *options) validate() error {
	if o.output != OutputText && o.output != OutputJSON {
		return fmt.Errorf("--output %q: want %s or %s", o.output, OutputText, OutputJSON)
	}
	return nil
}

// namespace is the namespace of the kubeconfig's context or --namespace,
// read without contacting a cluster; "default" when there is no
// kubeconfig.
func (o *options) namespace() string {
	ns, _, err := o.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil || ns == "" {
		return "default"
	}
	return ns
}

func (o *options) json(v any) error {
	enc := json.NewEncoder(o.streams.Out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (o *options) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(o.streams.Out, format, args...)
}

// validator builds the offline admission of the CRDs built into the
// plugin.
func validator() (*admit.Validator, error) {
	return admit.FromFS(crd.Bases, "bases")
}

// NewCommand returns the root command.
func NewCommand(s Streams) *cobra.Command {
	o := &options{streams: s, kube: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use: "kubectl-floodgate",
		// kubectl runs the binary kubectl-floodgate as "kubectl floodgate".
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl floodgate"},
		Short:       "Check, explain, simulate and inspect floodgate rate-limit policies",
		Long: `kubectl floodgate works with floodgate's RateLimitPolicies before and after they are applied.

  check      validate files as admission would (schema, CEL rules, webhook), offline
  explain    say what each rule limits, in words
  simulate   replay requests against a policy on a simulated clock
  status     show which pods enforce which revision, the store, and recent denials

Exit codes: 0 all is well, 1 problems found, 2 the command could not run.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.validate()
		},
	}
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.PersistentFlags().StringVarP(&o.output, "output", "o", OutputText, "output format: text or json")
	o.kube.AddFlags(root.PersistentFlags())
	root.AddCommand(newCheck(o), newExplain(o), newSimulate(o), newStatus(o))
	return root
}

// Main runs the plugin with args and returns the exit code.
func Main(args []string, s Streams) int {
	cmd := NewCommand(s)
	cmd.SetArgs(args)
	err := cmd.Execute()
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errFindings):
		return ExitFindings
	default:
		_, _ = fmt.Fprintf(s.ErrOut, "error: %v\n", err)
		return ExitError
	}
}

// fprintf writes to the output; like printf, it has nowhere to report a
// failed write to standard output.
func fprintf(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, args...)
}
