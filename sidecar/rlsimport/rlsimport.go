// Package rlsimport reads envoyproxy/ratelimit's YAML configuration
// format and maps it onto floodgate's sidecar config, so that a
// deployment of that service can move to floodgate-sidecar's Envoy
// rate-limit API without rewriting its limits.
//
// # The format
//
// Each YAML document is one domain:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: {unit: day, requests_per_unit: 5}
//	  - key: to_number
//	    rate_limit: {unit: day, requests_per_unit: 100, name: per_number}
//	    shadow_mode: false
//	    detailed_metric: true
//
// A document stream ("---" between documents) holds several domains.
// Unknown keys are errors, as they are in envoyproxy/ratelimit.
//
// # The mapping
//
// Every domain becomes one policy; every descriptor with a rate_limit
// becomes one rule of that policy whose match.descriptors has the domain
// and the entries from the top of the tree down to that descriptor, and
// whose limit is requests_per_unit per unit with the FixedWindow
// algorithm (epoch-aligned windows, as that service counts). unlimited
// becomes limit.unlimited, requests_per_unit 0 a rule that denies every
// call, shadow_mode mode: Shadow, and replaces the names of the rules
// generated from the descriptors with that rate_limit name. A descriptor
// with neither a rate_limit nor nested descriptors, which that service
// treats as whitelisted, becomes an unlimited rule, so that it still stops
// a less specific descriptor from applying. detailed_metric and
// value_to_metric only change that service's statistics names; floodgate
// never puts descriptor values in metric labels, and keeps per-rule
// metrics, so they are accepted and noted. See docs/envoy.md.
package rlsimport

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Domain is one document: a domain and its descriptor tree.
type Domain struct {
	Domain      string       `yaml:"domain"`
	Descriptors []Descriptor `yaml:"descriptors"`
}

// Descriptor is one node of the tree.
type Descriptor struct {
	Key            string       `yaml:"key"`
	Value          string       `yaml:"value"`
	RateLimit      *RateLimit   `yaml:"rate_limit"`
	Descriptors    []Descriptor `yaml:"descriptors"`
	ShadowMode     bool         `yaml:"shadow_mode"`
	DetailedMetric bool         `yaml:"detailed_metric"`
	ValueToMetric  bool         `yaml:"value_to_metric"`
	// ShareThreshold is parsed only to reject it with a clear error.
	ShareThreshold bool `yaml:"share_threshold"`
}

// RateLimit is a descriptor's limit.
type RateLimit struct {
	RequestsPerUnit uint32    `yaml:"requests_per_unit"`
	Unit            string    `yaml:"unit"`
	Unlimited       bool      `yaml:"unlimited"`
	Name            string    `yaml:"name"`
	Replaces        []Replace `yaml:"replaces"`
}

// Replace names a limit that a rate_limit replaces.
type Replace struct {
	Name string `yaml:"name"`
}

// Units are the units envoyproxy/ratelimit accepts, with their lengths
// (a month is 30 days and a year 365, as that service counts them).
var Units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// Parse decodes a stream of envoyproxy/ratelimit documents strictly:
// unknown keys and values of the wrong type are errors. Empty documents
// are skipped.
func Parse(data []byte) ([]Domain, error) {
	if len(data) > config.MaxDocumentSize {
		return nil, fmt.Errorf("parse envoy ratelimit config: document is %d bytes, the limit is %d", len(data), config.MaxDocumentSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var out []Domain
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parse envoy ratelimit config: document %d: %w", i+1, err)
		}
		if n.Kind == 0 || (n.Kind == yaml.DocumentNode && len(n.Content) == 0) {
			continue
		}
		var d Domain
		if err := decodeStrict(&n, &d); err != nil {
			return nil, fmt.Errorf("parse envoy ratelimit config: document %d: %w", i+1, err)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("parse envoy ratelimit config: no document")
	}
	return out, nil
}

// decodeStrict decodes a node with unknown fields rejected (Node.Decode
// does not apply the decoder's KnownFields, so the node is re-encoded).
func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// Rule is how one descriptor of the source maps onto a floodgate rule.
type Rule struct {
	// Domain and Path identify the descriptor the way envoyproxy/ratelimit
	// names it in its statistics: "key_value.key2".
	Domain, Path string
	// Policy and Name are the generated floodgate policy and rule names.
	Policy, Name string
	// Summary says what the rule does, for --check-config.
	Summary string
	// Notes are remarks on accepted settings that floodgate treats
	// differently.
	Notes []string
}

// Mapping records how a source was converted.
type Mapping struct {
	Domains int
	Rules   []Rule
	// Warnings are settings that can never take effect (a replaces naming
	// no rate_limit, shadow_mode on a descriptor without a rate_limit).
	Warnings []string
}

// Options tune the conversion.
type Options struct {
	// Replicas is every generated policy's replicas: the fail-open local
	// share is limit/Replicas. 0 means 1.
	Replicas int32
}

// Convert maps parsed domains onto a sidecar config. It reports every
// problem at once; the result still needs config.Validate, which Load
// runs.
func Convert(domains []Domain, o Options) (*config.Config, *Mapping, error) {
	c := &config.Config{APIVersion: config.APIVersion}
	m := &Mapping{Domains: len(domains)}
	var errs []error
	seenDomain := map[string]int{}
	usedPolicy := map[string]bool{}
	usedUID := map[string]bool{}
	for di, d := range domains {
		dp := fmt.Sprintf("document %d", di+1)
		if d.Domain == "" {
			errs = append(errs, fmt.Errorf("%s: domain must not be empty", dp))
			continue
		}
		if j, dup := seenDomain[d.Domain]; dup {
			errs = append(errs, fmt.Errorf("%s: duplicate domain %q (also document %d)", dp, d.Domain, j+1))
			continue
		}
		seenDomain[d.Domain] = di
		pol := config.Policy{
			Name:     uniqueName(d.Domain, usedPolicy, config.MaxNameLength),
			UID:      uniqueName("envoy."+d.Domain, usedUID, config.MaxUIDLength),
			Replicas: o.Replicas,
		}
		cv := &converter{domain: d.Domain, policy: pol.Name, used: map[string]bool{}, byName: map[string][]int{}, m: m, where: dp}
		cv.walk(d.Descriptors, nil, "", dp+": descriptors")
		errs = append(errs, cv.errs...)
		// Resolve replaces by rate_limit name.
		for _, pr := range cv.replaces {
			r := &cv.rules[pr.rule]
			for _, name := range pr.names {
				targets := cv.byName[name]
				if len(targets) == 0 {
					m.Warnings = append(m.Warnings, fmt.Sprintf("domain %q, %s: replaces %q, but no rate_limit in the domain has that name; it has no effect", d.Domain, pr.path, name))
					continue
				}
				for _, t := range targets {
					r.Match.Descriptors.Replaces = append(r.Match.Descriptors.Replaces, cv.rules[t].Name)
				}
			}
		}
		pol.Rules = cv.rules
		if len(pol.Rules) == 0 {
			m.Warnings = append(m.Warnings, fmt.Sprintf("domain %q has no descriptors; no call to it is limited", d.Domain))
			continue
		}
		c.Policies = append(c.Policies, pol)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return c, m, nil
}

type converter struct {
	domain, policy, where string
	rules                 []config.Rule
	used                  map[string]bool
	byName                map[string][]int // rate_limit name -> rule indices
	replaces              []pendingReplace
	errs                  []error
	m                     *Mapping
}

type pendingReplace struct {
	rule  int
	path  string
	names []string
}

func (cv *converter) errorf(path, format string, args ...any) {
	cv.errs = append(cv.errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// walk converts a descriptor list under the entries of its parents.
func (cv *converter) walk(ds []Descriptor, parent []config.DescriptorEntry, parentPath, where string) {
	seen := map[string]int{}
	for i, d := range ds {
		dp := fmt.Sprintf("%s[%d]", where, i)
		if d.Key == "" {
			cv.errorf(dp, "descriptor has empty key")
			continue
		}
		composite := d.Key
		if d.Value != "" {
			composite += "_" + d.Value
		}
		path := composite
		if parentPath != "" {
			path = parentPath + "." + composite
		}
		if j, dup := seen[composite]; dup {
			cv.errorf(dp, "duplicate descriptor composite key %q (also %s[%d])", cv.domain+"."+path, where, j)
			continue
		}
		seen[composite] = i
		if d.ShareThreshold {
			cv.errorf(dp+".share_threshold", "not supported by floodgate: wildcard matches always count per distinct value")
		}
		entries := append(append([]config.DescriptorEntry(nil), parent...), config.DescriptorEntry{Key: d.Key, Value: d.Value})
		switch {
		case d.RateLimit != nil:
			cv.limit(d, entries, path, dp)
		case len(d.Descriptors) == 0:
			// Whitelisted: matches, never limited.
			cv.add(config.Rule{Limit: config.Limit{Unlimited: true}}, entries, path,
				"no rate_limit and no nested descriptors: whitelisted, never limited", nil)
		}
		if d.RateLimit == nil && d.ShadowMode {
			cv.m.Warnings = append(cv.m.Warnings, fmt.Sprintf("domain %q, %s: shadow_mode without a rate_limit has no effect", cv.domain, path))
		}
		if len(d.Descriptors) > 0 {
			if len(entries) >= config.MaxDescriptorEntries {
				cv.errorf(dp+".descriptors", "nested deeper than %d levels", config.MaxDescriptorEntries)
				continue
			}
			cv.walk(d.Descriptors, entries, path, dp+".descriptors")
		}
	}
}

// limit converts a descriptor with a rate_limit.
func (cv *converter) limit(d Descriptor, entries []config.DescriptorEntry, path, dp string) {
	rl := d.RateLimit
	var notes []string
	r := config.Rule{}
	if d.ShadowMode {
		r.Mode = config.ModeShadow
	}
	if d.DetailedMetric {
		notes = append(notes, "detailed_metric: accepted; floodgate keeps this rule's metrics and never labels them with descriptor values")
	}
	if d.ValueToMetric {
		notes = append(notes, "value_to_metric: accepted; floodgate never labels metrics with descriptor values")
	}
	unit, validUnit := Units[strings.ToLower(rl.Unit)]
	var summary string
	switch {
	case rl.Unlimited:
		if validUnit {
			cv.errorf(dp+".rate_limit.unit", "should not specify rate limit unit when unlimited")
			return
		}
		if rl.RequestsPerUnit != 0 {
			cv.errorf(dp+".rate_limit.requests_per_unit", "should not specify requests_per_unit when unlimited")
			return
		}
		r.Limit = config.Limit{Unlimited: true}
		summary = "unlimited: matches and answers OK without counting"
	case !validUnit:
		cv.errorf(dp+".rate_limit.unit", "invalid rate limit unit %q: want second, minute, hour, day, week, month or year", rl.Unit)
		return
	default:
		r.Limit = config.Limit{Requests: int64(rl.RequestsPerUnit), Per: metav1.Duration{Duration: unit}, Algorithm: "FixedWindow"}
		if rl.RequestsPerUnit == 0 {
			summary = fmt.Sprintf("requests_per_unit 0: denies every call (window %s)", strings.ToLower(rl.Unit))
		} else {
			summary = fmt.Sprintf("%d per %s, FixedWindow", rl.RequestsPerUnit, strings.ToLower(rl.Unit))
		}
	}
	if d.ShadowMode {
		summary += ", shadow mode (counted, never denies)"
	}
	var names []string
	for i, rep := range rl.Replaces {
		switch rep.Name {
		case "":
			cv.errorf(fmt.Sprintf("%s.rate_limit.replaces[%d]", dp, i), "should not have an empty replaces entry")
			return
		case rl.Name:
			cv.errorf(fmt.Sprintf("%s.rate_limit.replaces[%d]", dp, i), "replaces should not contain name of same descriptor")
			return
		}
		names = append(names, rep.Name)
	}
	idx := cv.add(r, entries, path, summary, notes)
	if rl.Name != "" {
		cv.byName[rl.Name] = append(cv.byName[rl.Name], idx)
	}
	if len(names) > 0 {
		cv.replaces = append(cv.replaces, pendingReplace{rule: idx, path: path, names: names})
	}
}

// add appends a generated rule and its mapping record.
func (cv *converter) add(r config.Rule, entries []config.DescriptorEntry, path, summary string, notes []string) int {
	r.Name = uniqueName(path, cv.used, config.MaxNameLength)
	r.Match.Descriptors = &config.DescriptorMatch{Domain: cv.domain, Entries: entries}
	cv.rules = append(cv.rules, r)
	cv.m.Rules = append(cv.m.Rules, Rule{Domain: cv.domain, Path: path, Policy: cv.policy, Name: r.Name, Summary: summary, Notes: notes})
	return len(cv.rules) - 1
}

// uniqueName derives a name of at most max letters, digits, '-', '_' and
// '.' from s, unique among used: s itself when it qualifies, else s
// sanitized, shortened and suffixed with a hash of s.
// nameByte reports whether c may appear in a floodgate rule name.
func nameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		return true
	}
	return false
}

func uniqueName(s string, used map[string]bool, maxLen int) string {
	clean := []byte(s)
	changed := false
	for i, c := range clean {
		if !nameByte(c) {
			clean[i] = '-'
			changed = true
		}
	}
	name := string(clean)
	if changed || len(name) > maxLen || used[name] {
		sum := sha256.Sum256([]byte(s))
		suffix := "-" + hex.EncodeToString(sum[:6])
		if len(name) > maxLen-len(suffix) {
			name = name[:maxLen-len(suffix)]
		}
		name += suffix
	}
	used[name] = true
	return name
}

// Load parses, converts and validates an envoyproxy/ratelimit document
// stream. The config's revision is the digest of data.
func Load(data []byte, o Options) (*config.Config, *Mapping, error) {
	ds, err := Parse(data)
	if err != nil {
		return nil, nil, err
	}
	c, m, err := Convert(ds, o)
	if err != nil {
		return nil, nil, fmt.Errorf("envoy ratelimit config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("envoy ratelimit config, as converted: %w", err)
	}
	c.Revision = config.Digest(data)
	return c, m, nil
}
