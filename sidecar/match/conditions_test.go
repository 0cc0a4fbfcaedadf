package match

import (
	"net/http"
	"slices"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
)

func policy(t *testing.T, index int, p *config.Policy) *descriptor.Policy {
	t.Helper()
	pol, err := descriptor.NewPolicy(index, p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func TestMatchConditions(t *testing.T) {
	t.Parallel()
	// Policy 0 reads the client from X-Forwarded-For behind 192.0.2.0/24;
	// policy 1 uses the socket peer, 192.0.2.1.
	proxied := policy(t, 0, &config.Policy{TrustedProxies: &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}}})
	direct := policy(t, 1, &config.Policy{})
	rules := []Rule{
		0:  {Match: config.Match{Hosts: []string{"api.example.com", "*.example.org"}}},
		1:  {Match: config.Match{Headers: []config.HeaderMatch{{Name: "X-Tier", Regex: "free|trial"}}}},
		2:  {Match: config.Match{Headers: []config.HeaderMatch{{Name: "Authorization", Absent: true}}}},
		3:  {Match: config.Match{Headers: []config.HeaderMatch{{Name: "X-Beta", Value: "yes", Invert: true}}}},
		4:  {Match: config.Match{Headers: []config.HeaderMatch{{Name: "X-Internal", Invert: true}}}},
		5:  {Match: config.Match{Query: []config.QueryMatch{{Name: "page", Regex: "[0-9]+"}, {Name: "debug", Absent: true}}}},
		6:  {Match: config.Match{Query: []config.QueryMatch{{Name: "mode", Value: "bulk"}}}},
		7:  {Match: config.Match{SourceCIDRs: []string{"10.0.0.0/8", "2001:db8::/32"}}, Policy: proxied},
		8:  {Match: config.Match{SourceCIDRs: []string{"192.0.2.0/24"}}, Policy: direct},
		9:  {Match: config.Match{When: []string{"request.method == 'POST'", "request.headers['x-tier'] == 'free'"}}, Policy: direct},
		10: {Match: config.Match{When: []string{"source.address.startsWith('10.')"}}, Policy: proxied},
		11: {Match: config.Match{
			Path:    &config.PathMatch{Type: config.PathPrefix, Value: "/api"},
			Methods: []string{"GET"},
			Hosts:   []string{"api.example.com"},
			When:    []string{"size(request.path) > 8"},
		}, Policy: direct},
	}
	m, err := New(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		method, target string
		h              http.Header
		want           []int
	}{
		{"exact host", "GET", "http://api.example.com/x", nil, []int{0, 2, 3, 4}},
		{"host with port and upper case", "GET", "http://API.Example.com:8443/x", nil, []int{0, 2, 3, 4}},
		{"wildcard host, two labels deep", "GET", "http://a.b.example.org/x", nil, []int{0, 2, 3, 4}},
		{"wildcard does not match its apex", "GET", "http://example.org/x", nil, []int{2, 3, 4}},
		{"header regex matches whole values", "GET", "http://h/x", http.Header{"X-Tier": {"free"}}, []int{1, 2, 3, 4}},
		{"header regex is anchored", "GET", "http://h/x", http.Header{"X-Tier": {"freeloader"}}, []int{2, 3, 4}},
		{"absent fails when present", "GET", "http://h/x", http.Header{"Authorization": {"Bearer x"}}, []int{3, 4}},
		{"inverted value fails on the value", "GET", "http://h/x", http.Header{"X-Beta": {"no", "yes"}}, []int{2, 4}},
		{"inverted presence fails when present", "GET", "http://h/x", http.Header{"X-Internal": {"1"}}, []int{2, 3}},
		{"query regex and absent", "GET", "http://h/x?page=12", nil, []int{2, 3, 4, 5}},
		{"query absent fails when present", "GET", "http://h/x?page=12&debug", nil, []int{2, 3, 4}},
		{"query regex on a later value", "GET", "http://h/x?page=a&page=3", nil, []int{2, 3, 4, 5}},
		{"query value decoded", "GET", "http://h/x?mod%65=bul%6B", nil, []int{2, 3, 4, 6}},
		{"client network behind a trusted proxy", "GET", "http://h/x", http.Header{"X-Forwarded-For": {"10.1.2.3"}}, []int{2, 3, 4, 7, 8, 10}},
		{"client network, IPv6", "GET", "http://h/x", http.Header{"X-Forwarded-For": {"2001:db8::5"}}, []int{2, 3, 4, 7, 8}},
		{"all conditions hold", "POST", "http://h/x", http.Header{"X-Tier": {"free"}}, []int{1, 2, 3, 4, 9}},
		{"a condition fails", "POST", "http://h/x", http.Header{"X-Tier": {"gold"}}, []int{2, 3, 4}},
		{"a condition errs on a missing header", "POST", "http://h/x", nil, []int{2, 3, 4}},
		{"path, method, host and condition", "GET", "http://api.example.com/api/users", nil, []int{0, 2, 3, 4, 11}},
		{"the condition fails last", "GET", "http://api.example.com/api/u", nil, []int{0, 2, 3, 4}},
	} {
		got := m.Match(request(tc.method, tc.target, tc.h, 2), nil)
		// Rule 8 matches every request here: the peer is 192.0.2.1.
		got = slices.DeleteFunc(got, func(i int) bool { return i == 8 })
		want := slices.DeleteFunc(slices.Clone(tc.want), func(i int) bool { return i == 8 })
		if !slices.Equal(got, want) {
			t.Errorf("%s: Match(%s %s, %v) = %v, want %v", tc.name, tc.method, tc.target, tc.h, got, want)
		}
	}
	if got := m.Match(request("GET", "http://h/x", nil, 2), nil); !slices.Contains(got, 8) {
		t.Errorf("rule 8 (the peer's network) did not match: %v", got)
	}
}

func TestNewRejectsConditionsWithoutPolicy(t *testing.T) {
	t.Parallel()
	for _, m := range []config.Match{
		{SourceCIDRs: []string{"10.0.0.0/8"}},
		{When: []string{"true"}},
	} {
		if _, err := New([]Rule{{Match: m}}); err == nil {
			t.Errorf("New(%+v) without a policy succeeded", m)
		}
	}
	if _, err := New([]Rule{{Match: config.Match{When: []string{"request.nope"}}, Policy: &descriptor.Policy{}}}); err == nil {
		t.Error("New accepted a condition that does not compile")
	}
}

func TestExemption(t *testing.T) {
	t.Parallel()
	pol := policy(t, 0, &config.Policy{TrustedProxies: &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 1}})
	x, err := NewExemption(pol,
		&config.Exempt{SourceCIDRs: []string{"10.0.0.0/8"}},
		nil,
		&config.Exempt{When: []string{"request.path == '/healthz'", "request.method == 'GET'"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, target, xff string
		want                bool
	}{
		{"GET", "/x", "10.9.9.9", true},
		{"GET", "/x", "11.0.0.1", false},
		{"GET", "/healthz", "11.0.0.1", true},
		{"POST", "/healthz", "11.0.0.1", false},
	} {
		h := http.Header{"X-Forwarded-For": {tc.xff}}
		if got := x.Holds(request(tc.method, tc.target, h, 1)); got != tc.want {
			t.Errorf("Holds(%s %s from %s) = %v, want %v", tc.method, tc.target, tc.xff, got, tc.want)
		}
	}
	none, err := NewExemption(pol, nil, nil)
	if err != nil || none != nil {
		t.Errorf("NewExemption(nothing) = %v, %v; want nil, nil", none, err)
	}
	if none.Holds(request("GET", "/", nil, 1)) {
		t.Error("a nil Exemption exempts")
	}
}

// Rules whose conditions require a path prefix are indexed under it, and
// match exactly where the conditions hold.
func TestConditionsIndexedByPathPrefix(t *testing.T) {
	t.Parallel()
	pol := policy(t, 0, &config.Policy{})
	whens := [][]string{
		0: {"request.path.startsWith('/api/v')"},
		1: {"request.method == 'GET' && request.path.startsWith('/api/v1/')"},
		2: {"request.path == '/login'"},
		3: {"request.path.startsWith('/ap')"},
		4: {"request.path.startsWith('/api/') || request.path.startsWith('/static/')"},
		5: {"request.path.endsWith('/x')", "request.path.startsWith('/a/b/')"},
	}
	var rules []Rule
	for _, w := range whens {
		rules = append(rules, Rule{Match: config.Match{When: w}, Policy: pol})
	}
	m, err := New(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path string
		want         []int
	}{
		{"GET", "/api/v1/users", []int{0, 1, 3, 4}},
		{"POST", "/api/v1/users", []int{0, 3, 4}},
		{"GET", "/api/vx", []int{0, 3, 4}},
		{"GET", "/api/v1", []int{0, 3, 4}},
		{"GET", "/apix", []int{3}},
		{"GET", "/login", []int{2}},
		{"GET", "/login/", nil},
		{"GET", "/static/a.css", []int{4}},
		{"GET", "/a/b/c/x", []int{5}},
		{"GET", "/a/x", nil},
	} {
		got := m.Match(request(tc.method, tc.path, nil, 1), nil)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Match(%s %s) = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
	if got, want := m.root.children["api"].children["v1"].rules, []int{1}; !slices.Equal(got, want) {
		t.Errorf("rules at /api/v1/ = %v, want %v", got, want)
	}
}
