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
// detected by shape), compiles it for a pod with c's labels and name, and
// explains it on w, without opening a store or serving. It returns every
// problem found, each with its field path, and, as a sidecar started with
// c would, refuses fail-open shares c gives it no place in (placeShares).
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
	var problems []error
	if len(set.Failed) > 0 {
		// A sidecar would enforce the others; a check reports them all.
		errs := make([]error, len(set.Failed))
		for i := range set.Failed {
			errs[i] = fmt.Errorf("policies[%d] (%s): %w", set.Failed[i].Index, set.Failed[i].ID(), set.Failed[i].Err)
		}
		problems = append(problems, fmt.Errorf("%s: %d policies do not compile (a sidecar would enforce the others):\n%w", path, len(set.Failed), errors.Join(errs...)))
	}
	// What a sidecar started with these flags would refuse: its store and
	// mode come from them as they would when it serves. On the memory
	// store it never falls back to a share, so it enforces the file; the
	// same file on Redis is noted.
	sel := c.selectStore(cfg)
	unplaced := c.placeShares(set, true)
	if unplaced != nil && sel.Type == config.StoreRedis {
		problems = append(problems, fmt.Errorf("%s: a sidecar with these flags (%s store) refuses it:\n%w", path, sel.Type, unplaced))
	}
	if len(problems) > 0 {
		return errors.Join(problems...)
	}
	if _, err := fmt.Fprintf(w, "%s: valid (revision %s)\n", path, cfg.Revision); err != nil {
		return err
	}
	if err := rlsimport.Explain(w, cfg, format, mapping); err != nil {
		return err
	}
	native, total := set.Conditions()
	_, err = fmt.Fprintf(w, "\nfor a pod with labels {%s}: %s, %d Envoy descriptor rules in %d domains; ignored policies (podSelector): %v; replaced rules (replacedBy): %v; CEL conditions: %d, of which %d run as Go and %d in the interpreter\n",
		lbls.String(), rlsimport.HTTPRules(len(set.Rules), len(set.Concurrency)), len(set.Descriptors.Rules()), set.Descriptors.Domains(), set.Ignored, set.Replaced, total, native, total-native)
	if err == nil && unplaced != nil {
		_, err = fmt.Fprintf(w, "\nnote: on the %s store a sidecar never falls back to a share of a limit, so it enforces this file; on a Redis store (--store redis, or the file's store section) it refuses it:\n%v\n", sel.Type, unplaced)
	}
	return err
}
