package runner

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// Check validates the policy file at path, in either format the
// sidecar reads (floodgate's sidecar config or envoyproxy/ratelimit's,
// detected by shape), compiles it for a pod with c's labels, and explains
// it on w, without opening a store or serving. It returns every problem
// found, each with its field path.
func (c *Config) Check(w io.Writer, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("check config: %w", err)
	}
	if len(data) > config.MaxDocumentSize {
		return fmt.Errorf("check config %s: %d bytes, the limit is %d", path, len(data), config.MaxDocumentSize)
	}
	cfg, format, mapping, err := rlsimport.LoadAny(data, rlsimport.Options{})
	if err != nil {
		return fmt.Errorf("%s is not a valid config:\n%w", path, err)
	}
	lbls, err := c.Labels()
	if err != nil {
		return fmt.Errorf("pod labels: %w", err)
	}
	set, err := ruleset.CompileFor(cfg, ruleset.Pod{Labels: lbls, Name: c.PodName}, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		return fmt.Errorf("%s does not compile:\n%w", path, err)
	}
	if len(set.Failed) > 0 {
		// A sidecar would enforce the others; a check reports them all.
		errs := make([]error, len(set.Failed))
		for i := range set.Failed {
			errs[i] = fmt.Errorf("policies[%d] (%s): %w", set.Failed[i].Index, set.Failed[i].ID(), set.Failed[i].Err)
		}
		return fmt.Errorf("%s: %d policies do not compile (a sidecar would enforce the others):\n%w", path, len(set.Failed), errors.Join(errs...))
	}
	if _, err := fmt.Fprintf(w, "%s: valid (revision %s)\n", path, cfg.Revision); err != nil {
		return err
	}
	if err := rlsimport.Explain(w, cfg, format, mapping); err != nil {
		return err
	}
	native, total := set.Conditions()
	_, err = fmt.Fprintf(w, "\nfor a pod with labels {%s}: %d HTTP rules, %d Envoy descriptor rules in %d domains; ignored policies (podSelector): %v; replaced rules (replacedBy): %v; CEL conditions: %d, of which %d run as Go and %d in the interpreter\n",
		lbls.String(), len(set.Rules), len(set.Descriptors.Rules()), set.Descriptors.Domains(), set.Ignored, set.Replaced, total, native, total-native)
	return err
}
