package v1alpha1

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// The CRD's markers hold the API's bounds as literals, which controller-gen
// copies into the schema. This test reads the generated CRD and fails when
// a bound there and its constant (the sidecar's, where it has one)
// disagree: change the marker, then run make manifests.
func TestCRDMarkersHoldTheBounds(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../config/crd/bases/ratelimit.floodgate.dev_ratelimitpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("%d versions, want 1", len(crd.Spec.Versions))
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	at := func(s apiextensionsv1.JSONSchemaProps, path ...string) apiextensionsv1.JSONSchemaProps {
		t.Helper()
		for _, p := range path {
			if p == "[]" {
				if s.Items == nil || s.Items.Schema == nil {
					t.Fatalf("no items at %s", strings.Join(path, "."))
				}
				s = *s.Items.Schema
				continue
			}
			next, ok := s.Properties[p]
			if !ok {
				t.Fatalf("no property %s in %s", p, strings.Join(path, "."))
			}
			s = next
		}
		return s
	}
	rule := at(spec, "rules", "[]")
	limit := at(rule, "limit")

	for _, tc := range []struct {
		name string
		got  *int64
		want int64
	}{
		{"spec.rules maxItems", at(spec, "rules").MaxItems, maxRules},
		{"spec.rules[].name maxLength", at(rule, "name").MaxLength, config.MaxNameLength},
		{"spec.rules[].key maxItems", at(rule, "key").MaxItems, config.MaxKeyParts},
		{"spec.rules[].keys maxItems", at(rule, "keys").MaxItems, config.MaxKeyAlternatives},
		{"spec.rules[].keys[] maxItems", at(rule, "keys", "[]").MaxItems, config.MaxKeyParts},
		{"spec.rules[].match.headers maxItems", at(rule, "match", "headers").MaxItems, maxHeaderMatches},
		{"spec.rules[].match.path.value maxLength", at(rule, "match", "path", "value").MaxLength, config.MaxRegexLength},
		{"spec.trustedProxies.cidrs maxItems", at(spec, "trustedProxies", "cidrs").MaxItems, maxTrustedCIDRs},
		{"spec.rules[].match.headers maxItems (sidecar)", at(rule, "match", "headers").MaxItems, config.MaxValueMatches},
		{"spec.rules[].match.headers[].regex maxLength", at(rule, "match", "headers", "[]", "regex").MaxLength, config.MaxRegexLength},
		{"spec.rules[].match.headers[].value maxLength", at(rule, "match", "headers", "[]", "value").MaxLength, config.MaxMatchValueLength},
		{"spec.rules[].match.query maxItems", at(rule, "match", "query").MaxItems, config.MaxValueMatches},
		{"spec.rules[].match.query[].name maxLength", at(rule, "match", "query", "[]", "name").MaxLength, config.MaxMatchNameLength},
		{"spec.rules[].match.query[].regex maxLength", at(rule, "match", "query", "[]", "regex").MaxLength, config.MaxRegexLength},
		{"spec.rules[].match.hosts maxItems", at(rule, "match", "hosts").MaxItems, config.MaxHosts},
		{"spec.rules[].match.hosts[] maxLength", at(rule, "match", "hosts", "[]").MaxLength, config.MaxHostLength},
		{"spec.rules[].match.sourceCIDRs maxItems", at(rule, "match", "sourceCIDRs").MaxItems, config.MaxCIDRs},
		{"spec.rules[].match.when maxItems", at(rule, "match", "when").MaxItems, config.MaxConditions},
		{"spec.rules[].match.when[] maxLength", at(rule, "match", "when", "[]").MaxLength, config.MaxExpressionLength},
		{"spec.rules[].key[].expression maxLength", at(rule, "key", "[]", "expression").MaxLength, config.MaxExpressionLength},
		{"spec.rules[].exempt.when maxItems", at(rule, "exempt", "when").MaxItems, config.MaxConditions},
		{"spec.exempt.sourceCIDRs maxItems", at(spec, "exempt", "sourceCIDRs").MaxItems, config.MaxCIDRs},
		{"spec.exempt.when maxItems", at(spec, "exempt", "when").MaxItems, config.MaxConditions},
		{"spec.exempt.when[] maxLength", at(spec, "exempt", "when", "[]").MaxLength, config.MaxExpressionLength},
	} {
		if tc.got == nil || *tc.got != tc.want {
			t.Errorf("%s = %v, want %d", tc.name, deref(tc.got), tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		got  *float64
		want int64
	}{
		{"spec.rules[].limit.requests maximum", at(limit, "requests").Maximum, limiter.MaxRequests},
		{"spec.rules[].limit.requests minimum", at(limit, "requests").Minimum, 1},
		{"spec.rules[].limit.burst maximum", at(limit, "burst").Maximum, limiter.MaxRequests},
		{"spec.rules[].cost.default maximum", at(rule, "cost", "default").Maximum, limiter.MaxRequests},
		{"spec.rules[].cost.max maximum", at(rule, "cost", "max").Maximum, limiter.MaxRequests},
		{"spec.trustedProxies.hops maximum", at(spec, "trustedProxies", "hops").Maximum, config.MaxHops},
		{"spec.rules[].limit.split maximum", at(limit, "split").Maximum, limiter.MaxSplit},
		{"spec.rules[].limit.split minimum", at(limit, "split").Minimum, 1},
		{"spec.rules[].limit.delayAfter maximum", at(limit, "delayAfter").Maximum, limiter.MaxRequests},
		{"spec.rules[].limit.delayAfter minimum", at(limit, "delayAfter").Minimum, 1},
	} {
		if tc.got == nil || *tc.got != float64(tc.want) {
			t.Errorf("%s = %v, want %d", tc.name, derefF(tc.got), tc.want)
		}
	}

	// The CEL rules: the period's and maxDelay's ranges, and SlidingLog's
	// size.
	durations := regexp.MustCompile(`duration\('([^']+)'\)`)
	var per []time.Duration
	for _, v := range at(limit, "per").XValidations {
		for _, m := range durations.FindAllStringSubmatch(v.Rule, -1) {
			if d, err := time.ParseDuration(m[1]); err == nil {
				per = append(per, d)
			}
		}
	}
	if len(per) != 2 || per[0] != limiter.MinPeriod || per[1] != limiter.MaxPeriod {
		t.Errorf("spec.rules[].limit.per rule bounds %v, want [%v %v]", per, limiter.MinPeriod, limiter.MaxPeriod)
	}
	var maxDelay []time.Duration
	for _, v := range at(limit, "maxDelay").XValidations {
		for _, m := range durations.FindAllStringSubmatch(v.Rule, -1) {
			if d, err := time.ParseDuration(m[1]); err == nil {
				maxDelay = append(maxDelay, d)
			}
		}
	}
	if len(maxDelay) != 2 || maxDelay[0] != config.MinMaxDelay || maxDelay[1] != limiter.MaxMaxDelay {
		t.Errorf("spec.rules[].limit.maxDelay rule bounds %v, want [%v %v]", maxDelay, config.MinMaxDelay, limiter.MaxMaxDelay)
	}
	slidingLog := regexp.MustCompile(`self\.algorithm != 'SlidingLog' \|\| self\.requests <= (\d+)`)
	found := false
	for _, v := range limit.XValidations {
		m := slidingLog.FindStringSubmatch(v.Rule)
		if m == nil {
			continue
		}
		found = true
		if got, want := m[1], strconv.Itoa(limiter.MaxLogRequests); got != want {
			t.Errorf("SlidingLog rule bound %s, want %s", got, want)
		}
		if want := "at most " + strconv.Itoa(limiter.MaxLogRequests) + ";"; !strings.Contains(v.Message, want) {
			t.Errorf("SlidingLog rule message %q does not say %q", v.Message, want)
		}
	}
	if !found {
		t.Error("no SlidingLog rule on spec.rules[].limit")
	}
	if got, want := int64(MaxSlidingLogRequests), int64(limiter.MaxLogRequests); got != want {
		t.Errorf("MaxSlidingLogRequests = %d, want the limiter's %d", got, want)
	}
}

// The ClusterRateLimitPolicy's rules are the RateLimitPolicy's rules: the
// same schema, with the same bounds and CEL rules, so that a rule moves
// between the two unchanged. Its name bound keeps "cluster.<name>" within
// the sidecar config's names.
func TestClusterCRDSharesTheRuleSchema(t *testing.T) {
	t.Parallel()
	load := func(file string) apiextensionsv1.JSONSchemaProps {
		t.Helper()
		data, err := os.ReadFile("../../config/crd/bases/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		return *crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	rlp := load("ratelimit.floodgate.dev_ratelimitpolicies.yaml")
	crlp := load("ratelimit.floodgate.dev_clusterratelimitpolicies.yaml")
	want := rlp.Properties["spec"].Properties["rules"].Items.Schema
	for _, list := range []string{"defaults", "overrides"} {
		got := crlp.Properties["spec"].Properties[list].Properties["rules"].Items.Schema
		a, _ := yaml.Marshal(got)
		b, _ := yaml.Marshal(want)
		if string(a) != string(b) {
			t.Errorf("spec.%s.rules[] differs from the RateLimitPolicy's spec.rules[]", list)
		}
	}
	if got, want := len(ClusterPolicyPrefix)+MaxClusterPolicyNameLength, config.MaxNameLength; got != want {
		t.Errorf("a compiled cluster policy name is up to %d characters, want the sidecar's %d", got, want)
	}
	found := false
	for _, v := range crlp.XValidations {
		found = found || strings.Contains(v.Rule, "self.metadata.name.size() <= "+strconv.Itoa(MaxClusterPolicyNameLength))
	}
	if !found {
		t.Errorf("no CEL rule bounds metadata.name at %d", MaxClusterPolicyNameLength)
	}
}

func deref(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func derefF(p *float64) any {
	if p == nil {
		return "unset"
	}
	return *p
}
