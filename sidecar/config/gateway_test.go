package config

import (
	"slices"
	"testing"
)

// The headers an expression reads by name are what a gateway must send
// for it; any other read of request.headers cannot be listed.
func TestExpressionHeaders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		kind ExpressionKind
		want []string
		any  bool
	}{
		{"request.headers['x-tier'] == 'free'", Condition, []string{"x-tier"}, false},
		{"'X-Beta' in request.headers && request.method == 'POST'", Condition, []string{"x-beta"}, false},
		{"has(request.headers.x_flag) || request.headers.x_flag == '1'", Condition, []string{"x_flag"}, false},
		{"request.headers['b'] != request.headers['a'] || 'a' in request.headers", Condition, []string{"a", "b"}, false},
		{"request.headers['x-tenant'] + '/' + request.path", KeyValue, []string{"x-tenant"}, false},
		{"request.path.startsWith('/api/') && source.address != '10.0.0.1'", Condition, nil, false},
		{"request.headers.exists(k, k.startsWith('x-'))", Condition, nil, true},
		{"size(request.headers) > 10", Condition, nil, true},
		{"request.headers[request.query['h']] == 'x'", Condition, nil, true},
	} {
		e, err := CompileExpression(tc.expr, tc.kind)
		if err != nil {
			t.Errorf("CompileExpression(%q) = %v", tc.expr, err)
			continue
		}
		if !slices.Equal(e.Headers, tc.want) || e.AnyHeader != tc.any {
			t.Errorf("CompileExpression(%q): headers %q, any %v; want %q, %v", tc.expr, e.Headers, e.AnyHeader, tc.want, tc.any)
		}
	}
}

// RequestHeaders lists every header a policy's HTTP rules read, in every
// place a rule can read one, and names an expression whose reads cannot
// be listed.
func TestRequestHeaders(t *testing.T) {
	t.Parallel()
	p := &Policy{
		JWT:    &JWT{Header: "X-Token", UpstreamVerified: true},
		Exempt: &Exempt{When: []string{"request.headers['x-internal'] == 'yes'"}},
		Rules: []Rule{{
			Name:  "a",
			Match: Match{Headers: []HeaderMatch{{Name: "x-api-key"}}, When: []string{"request.headers['x-tier'] == 'free'"}},
			Keys:  [][]KeyPart{{{Header: "X-Tenant"}}, {{Expression: "request.headers['x-user']"}}},
			Cost:  Cost{FromHeader: "X-Cost"},
		}, {
			Name:   "b",
			Key:    []KeyPart{{Expression: "string(auth.claims.sub)"}},
			Exempt: &Exempt{When: []string{"'x-canary' in request.headers"}},
		}, {
			Name:  "descriptors",
			Match: Match{Descriptors: &DescriptorMatch{Domain: "d"}, Headers: []HeaderMatch{{Name: "X-Ignored"}}},
		}},
	}
	got, err := RequestHeaders(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"X-Internal", "X-Api-Key", "X-Tier", "X-Tenant", "X-User", "X-Cost", "X-Token", "X-Canary"}
	if !slices.Equal(got, want) {
		t.Errorf("RequestHeaders = %q, want %q", got, want)
	}

	p.Rules[1].Match.When = []string{"request.headers.exists(k, k == 'x')"}
	if _, err := RequestHeaders(p); err == nil || err.Error() != "rules[1].match.when[0]: reads request.headers other than by a literal name, so no list of headers covers it" {
		t.Errorf("RequestHeaders with an unlisted read = %v", err)
	}
}
