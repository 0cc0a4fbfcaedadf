package rlsimport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Format is a config document's format.
type Format uint8

// The formats a policy file may be written in.
const (
	// FormatFloodgate is floodgate's sidecar config (apiVersion
	// floodgate.dev/sidecar-config/v1), in YAML or JSON.
	FormatFloodgate Format = iota + 1
	// FormatEnvoy is envoyproxy/ratelimit's YAML: one domain per
	// document.
	FormatEnvoy
)

func (f Format) String() string {
	switch f {
	case FormatFloodgate:
		return "floodgate sidecar config (" + config.APIVersion + ")"
	case FormatEnvoy:
		return "envoyproxy/ratelimit config"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// Detect tells the format of a document by its shape: a top-level
// apiVersion is floodgate's, a top-level domain or descriptors is
// envoyproxy/ratelimit's. The first non-empty document decides.
func Detect(data []byte) (Format, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var top map[string]any
		err := dec.Decode(&top)
		if errors.Is(err, io.EOF) {
			return 0, errors.New("empty document: want a floodgate sidecar config (apiVersion: " + config.APIVersion + ") or an envoyproxy/ratelimit config (domain: ...)")
		}
		if err != nil {
			return 0, fmt.Errorf("not YAML or JSON: %w", err)
		}
		if top == nil {
			continue
		}
		_, api := top["apiVersion"]
		_, dom := top["domain"]
		_, descs := top["descriptors"]
		switch {
		case api:
			return FormatFloodgate, nil
		case dom || descs:
			return FormatEnvoy, nil
		}
		keys := make([]string, 0, len(top))
		for k := range top {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return 0, fmt.Errorf("unknown format: top-level keys %v; want apiVersion (floodgate sidecar config) or domain and descriptors (envoyproxy/ratelimit config)", keys)
	}
}

// LoadAny loads a document in either format, detected by Detect. The
// Mapping is nil for floodgate's format.
func LoadAny(data []byte, o Options) (*config.Config, Format, *Mapping, error) {
	f, err := Detect(data)
	if err != nil {
		// Neither shape: report floodgate's own parse or validation
		// errors, the sidecar's primary format, and why neither matched.
		_, lerr := config.Load(data)
		if lerr == nil {
			lerr = errors.New("not a sidecar config")
		}
		return nil, 0, nil, fmt.Errorf("%w\n(the document is neither a floodgate sidecar config nor an envoyproxy/ratelimit config: %w)", lerr, err)
	}
	if f == FormatEnvoy {
		c, m, err := Load(data, o)
		return c, f, m, err
	}
	c, err := config.Load(data)
	return c, f, nil, err
}

// Explain writes a human-readable account of a loaded config: its
// policies and rules, what each matches and what limit it applies, and
// for an envoyproxy/ratelimit source how each descriptor was mapped.
func Explain(w io.Writer, c *config.Config, f Format, m *Mapping) error {
	ew := &errWriter{w: w}
	ew.printf("format: %s\n", f)
	if m != nil {
		ew.printf("domains: %d, rules: %d (each domain is a policy; each descriptor with a rate_limit is a rule)\n", m.Domains, len(m.Rules))
	} else {
		ew.printf("policies: %d, rules: %s\n", len(c.Policies), countRules(c))
	}
	if c.Store.Type != "" {
		ew.printf("store: %s %s\n", c.Store.Type, strings.Join(c.Store.Addresses, ","))
	}
	var notes map[[2]string]Rule
	if m != nil {
		notes = map[[2]string]Rule{}
		for _, r := range m.Rules {
			notes[[2]string{r.Policy, r.Name}] = r
		}
	}
	// The engine derives a concurrency rule's numbers, and registers its
	// metrics while it does.
	met := metrics.NewMetrics(prometheus.NewRegistry())
	for i := range c.Policies {
		p := &c.Policies[i]
		ew.printf("\npolicy %s (uid %s, replicas %d)\n", p.Name, p.UID, max(p.Replicas, 1))
		for j := range p.Rules {
			r := &p.Rules[j]
			limit, err := describeLimit(p, r, met)
			if err != nil {
				return fmt.Errorf("policy %s, rule %s: %w", p.Name, r.Name, err)
			}
			ew.printf("  rule %s\n", r.Name)
			ew.printf("    match: %s\n", describeMatch(r))
			ew.printf("    limit: %s\n", limit)
			if mr, ok := notes[[2]string{p.Name, r.Name}]; ok {
				ew.printf("    from:  %s.%s: %s\n", mr.Domain, mr.Path, mr.Summary)
				for _, n := range mr.Notes {
					ew.printf("    note:  %s\n", n)
				}
			}
		}
	}
	if m != nil {
		for _, wn := range m.Warnings {
			ew.printf("\nwarning: %s\n", wn)
		}
	}
	return ew.err
}

func describeMatch(r *config.Rule) string {
	if d := r.Match.Descriptors; d != nil {
		parts := make([]string, 0, len(d.Entries))
		for _, e := range d.Entries {
			switch {
			case e.Value == "":
				parts = append(parts, fmt.Sprintf("(%s, any value: a counter per value)", e.Key))
			case strings.HasSuffix(e.Value, "*"):
				parts = append(parts, fmt.Sprintf("(%s, values starting %q: a counter per value)", e.Key, strings.TrimSuffix(e.Value, "*")))
			default:
				parts = append(parts, fmt.Sprintf("(%s, %q)", e.Key, e.Value))
			}
		}
		s := fmt.Sprintf("Envoy descriptor in domain %q: %s", d.Domain, strings.Join(parts, ", "))
		if len(d.Replaces) > 0 {
			s += fmt.Sprintf("; replaces %s", strings.Join(d.Replaces, ", "))
		}
		return s
	}
	s := "HTTP " + Applies(&r.Match)
	if !r.IsRate() && r.Concurrency == nil {
		return s // only a priority: it reads no key
	}
	return s + "; counted by " + Counter(r.KeyAlternatives())
}

// describeLimit words what rule r of policy p does to the requests it
// matches. A rule without a limit is a concurrency cap or only a priority,
// worded as kubectl floodgate explain words it (DescribeUnrated); the
// engine builds its concurrency rule with m.
func describeLimit(p *config.Policy, r *config.Rule, m *metrics.Metrics) (string, error) {
	if r.Match.Descriptors == nil && !r.IsRate() {
		u, err := DescribeUnrated(p, r, m)
		return u.Limit, err
	}
	l := r.Limit
	var s string
	switch {
	case l.Unlimited:
		s = "unlimited (never counted, never denies)"
	case l.Requests == 0:
		s = fmt.Sprintf("denies every call (window %v)", l.Per.Duration)
	default:
		alg := l.Algorithm
		if alg == "" {
			alg = "TokenBucket"
		}
		s = fmt.Sprintf("%d per %v, %s", l.Requests, l.Per.Duration, alg)
		if l.Burst > 0 {
			s += fmt.Sprintf(", burst %d", l.Burst)
		}
	}
	if r.Mode == config.ModeShadow {
		s += "; shadow: counted and reported, never denies"
	}
	if r.FailureMode == config.FailureClosed {
		s += "; fails closed when the store is unreachable"
	} else if !l.Unlimited && l.Requests > 0 {
		s += "; fails open to a local share when the store is unreachable"
	}
	return s, nil
}

// countRules counts the rules of c, by kind when they are not all rate
// rules: "2", "3 (1 rate, 1 concurrency, 1 priority only)".
func countRules(c *config.Config) string {
	var total, rate, conc, prio, desc int
	for i := range c.Policies {
		for j := range c.Policies[i].Rules {
			r := &c.Policies[i].Rules[j]
			total++
			switch {
			case r.Match.Descriptors != nil:
				desc++
			case r.Concurrency != nil:
				conc++
			case r.IsRate():
				rate++
			default:
				prio++
			}
		}
	}
	if rate == total {
		return strconv.Itoa(total)
	}
	var kinds []string
	for _, k := range []struct {
		n    int
		kind string
	}{{rate, "rate"}, {conc, "concurrency"}, {prio, "priority only"}, {desc, "Envoy descriptor"}} {
		if k.n > 0 {
			kinds = append(kinds, fmt.Sprintf("%d %s", k.n, k.kind))
		}
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(kinds, ", "))
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
