package compiler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// largeRules returns 64 rules of about 1 KB each.
func largeRules() []v1alpha1.Rule {
	var rules []v1alpha1.Rule
	for i := range 64 {
		rules = append(rules, v1alpha1.Rule{Name: fmt.Sprintf("rule-%02d", i),
			Match: &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "/" + strings.Repeat("x", 900)}},
			Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}}, Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}}})
	}
	return rules
}

// policyCopy returns a copy of base named
// name in namespace ns, created at the given second, with rules.
func policyCopy(base v1alpha1.RateLimitPolicy, ns, name string, created int, rules []v1alpha1.Rule) v1alpha1.RateLimitPolicy {
	p := base
	p.Namespace, p.Name = ns, name
	p.UID = types.UID(fmt.Sprintf("5d0f3c1e-0000-4000-8000-%012d", created))
	p.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000+int64(created), 0))
	p.Spec.Rules = rules
	return p
}

// One tenant's large policies cannot push another tenant's policy out of
// the central rate-limit service's document: team-a's 30 large policies,
// all created first, do not fit; team-b's small policy, created last, is
// kept, and so are team-b's three large ones, which fit in its share.
// team-a keeps its oldest policies that fit in the rest, and each of its
// others is left out with the share named; none is refused as invalid.
func TestCentralDocumentSharesOutByNamespace(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/ratelimitservice/two-namespaces.yaml")
	base := in.Policies[0]
	small := base.Spec.Rules
	in.Policies = nil
	for i := range 30 {
		in.Policies = append(in.Policies, policyCopy(base, "team-a", fmt.Sprintf("a%02d", i), i, largeRules()))
	}
	for i := range 3 {
		in.Policies = append(in.Policies, policyCopy(base, "team-b", fmt.Sprintf("b%02d", i), 100+i, largeRules()))
	}
	in.Policies = append(in.Policies, policyCopy(base, "team-b", "small", 200, small))

	out, err := CompileRateLimitService(ServiceInput{Policies: in.Policies, Pods: in.Pods, Stores: in.Stores})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Data) > MaxDocumentBytes {
		t.Fatalf("document of %d bytes, over %d", len(out.Data), MaxDocumentBytes)
	}
	c, err := config.Load([]byte(out.Data))
	if err != nil {
		t.Fatalf("the central service rejects the document: %v", err)
	}
	inDoc := func(r PolicyResult) bool {
		return slices.ContainsFunc(c.Policies, func(p config.Policy) bool { return p.Name == r.Name && p.Namespace == r.Namespace })
	}
	keptA := 0
	for _, r := range out.Policies {
		if !r.Accepted() {
			t.Errorf("%s/%s is refused as invalid: %v", r.Namespace, r.Name, r.Invalid)
		}
		switch {
		case r.Namespace == "team-b":
			if !inDoc(r) || r.LeftOut != "" || r.CompiledGeneration == 0 {
				t.Errorf("team-b's %s: in the document %v, left out %q, compiled generation %d; want it kept", r.Name, inDoc(r), r.LeftOut, r.CompiledGeneration)
			}
		case inDoc(r):
			keptA++
			if r.LeftOut != "" {
				t.Errorf("%s is in the document but reported left out: %s", r.Name, r.LeftOut)
			}
		default:
			if r.CompiledGeneration != 0 || !strings.Contains(r.LeftOut, "namespace team-a's share of it is") {
				t.Errorf("team-a's %s left out: compiled generation %d, reason %q; want 0 and the share named", r.Name, r.CompiledGeneration, r.LeftOut)
			}
		}
	}
	if keptA == 0 || keptA == 30 {
		t.Fatalf("team-a keeps %d of its 30 policies, want some but not all", keptA)
	}
	// The ones kept are those created first.
	for _, r := range out.Policies {
		if r.Namespace != "team-a" {
			continue
		}
		var idx int
		_, _ = fmt.Sscanf(r.Name, "a%d", &idx)
		if inDoc(r) != (idx < keptA) {
			t.Errorf("team-a's %s in the document: %v; want the %d created first", r.Name, inDoc(r), keptA)
		}
	}
	// Sharing out leaves no room unused that a left-out policy of
	// team-a would fit in.
	one := len(out.Data) / (keptA + 4)
	if len(out.Data)+one <= MaxDocumentBytes-MaxDocumentBytes/20 {
		t.Errorf("document of %d bytes with %d of team-a's policies: room for another of about %d bytes is left", len(out.Data), keptA, one)
	}
	t.Logf("document %d bytes: team-a keeps %d of 30 large policies, team-b all 4", len(out.Data), keptA)
}

// A policy too large for what its share has left does not keep a later,
// smaller one out: the document is filled in order of creation, skipping
// what does not fit.
func TestDocumentSkipsAPolicyTooLargeForWhatIsLeft(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	base := in.Policies[0]
	in.Policies = nil
	for i := range 15 {
		in.Policies = append(in.Policies, policyCopy(base, base.Namespace, fmt.Sprintf("p%02d", i), i, largeRules()))
	}
	// Created after 17 large ones, of which the document holds about
	// ten: the small one still fits.
	in.Policies = append(in.Policies, policyCopy(base, base.Namespace, "p15", 15, largeRules()))
	in.Policies = append(in.Policies, policyCopy(base, base.Namespace, "p16", 16, largeRules()))
	in.Policies = append(in.Policies, policyCopy(base, base.Namespace, "small", 17, base.Spec.Rules))
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Data) > MaxDocumentBytes {
		t.Fatalf("document of %d bytes, over %d", len(out.Data), MaxDocumentBytes)
	}
	var left []string
	for _, r := range out.Policies {
		if r.LeftOut != "" {
			left = append(left, r.Name)
		}
		if r.Name == "small" && (r.LeftOut != "" || r.CompiledGeneration == 0) {
			t.Errorf("the small policy created last is left out (%q), though it fits", r.LeftOut)
		}
	}
	if len(left) == 0 || slices.Contains(left, "small") {
		t.Errorf("left out: %v; want some large policies created last, not the small one", left)
	}
	t.Logf("document %d bytes; left out %v", len(out.Data), left)
}

func TestFairShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		demand []int
		total  int
		want   []int
	}{
		{"all fit", []int{10, 20}, 100, []int{10, 20}},
		{"small first, the rest split", []int{100, 10, 100}, 150, []int{70, 10, 70}},
		{"even split", []int{100, 100, 100}, 90, []int{30, 30, 30}},
		{"one large, one small", []int{1000, 30}, 100, []int{70, 30}},
		{"nothing to share", []int{5, 5}, 0, []int{0, 0}},
		{"negative total", []int{5}, -3, []int{0}},
		{"none", nil, 100, []int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			demand := make([]size, len(tc.demand))
			for i, d := range tc.demand {
				demand[i] = size{bytes: d, rules: d}
			}
			got := fairShares(demand, size{bytes: tc.total, rules: tc.total})
			sum := 0
			for i, s := range got {
				if s.bytes != tc.want[i] || s.rules != tc.want[i] {
					t.Errorf("share %d = %+v, want %d of each", i, s, tc.want[i])
				}
				if s.bytes > tc.demand[i] {
					t.Errorf("share %d = %d, more than its demand %d", i, s.bytes, tc.demand[i])
				}
				sum += s.bytes
			}
			if sum > max(tc.total, 0) {
				t.Errorf("shares add up to %d, over the total %d", sum, tc.total)
			}
		})
	}
}
