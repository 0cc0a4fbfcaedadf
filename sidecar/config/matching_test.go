package config

import (
	"strings"
	"testing"
)

// matchingYAML uses every matching field, an exemption on the policy and a
// rule, a key expression and a replaced rule.
const matchingYAML = `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: floor
  uid: floor-uid
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 1000, per: 1s}
    replacedBy: [team-uid]
- name: team
  uid: team-uid
  jwt: {upstreamVerified: true}
  exempt: {sourceCIDRs: [10.0.0.0/8], when: ["request.path == '/healthz'"]}
  rules:
  - name: api
    match:
      hosts: [api.example.com, "*.example.org"]
      headers:
      - {name: X-Tier, regex: "free|trial"}
      - {name: X-Internal, absent: true}
      - {name: X-Beta, value: "yes", invert: true}
      query: [{name: debug, absent: true}, {name: v, regex: "[0-9]+"}]
      sourceCIDRs: [192.0.2.0/24, "2001:db8::/32"]
      when:
      - request.method in ['GET', 'HEAD']
      - "!('x-probe' in request.headers)"
      - auth.claims.tier == 'free'
    key: [{expression: "request.headers['x-org'] + '/' + request.path"}]
    limit: {requests: 100, per: 1m}
    exempt: {when: ["cidr('172.16.0.0/12').containsIP(source.address)"]}
`

func TestValidateAcceptsEveryMatchingField(t *testing.T) {
	t.Parallel()
	c, err := Load([]byte(matchingYAML))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	m := c.Policies[1].Rules[0].Match
	if got, want := len(m.When), 3; got != want {
		t.Errorf("when = %d conditions, want %d", got, want)
	}
	if got, want := m.Headers[0].Regex, "free|trial"; got != want {
		t.Errorf("headers[0].regex = %q, want %q", got, want)
	}
	if !m.Headers[1].Absent || !m.Headers[2].Invert || !m.Query[0].Absent {
		t.Errorf("absent and invert not read: %+v %+v", m.Headers, m.Query)
	}
	if got, want := c.Policies[0].Rules[0].ReplacedBy, []string{"team-uid"}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("replacedBy = %v, want %v", got, want)
	}
}

func TestValidateRejectsBadMatchingWithPaths(t *testing.T) {
	t.Parallel()
	rule := func(body string) string {
		return `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: p-uid
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
` + body
	}
	tests := []struct {
		name, doc string
		want      []string
	}{{
		name: "a condition that does not parse",
		doc:  rule("    match: {when: [\"request.path.startsWith('/a'\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "not a valid CEL expression", "Syntax error"},
	}, {
		name: "an unknown variable",
		doc:  rule("    match: {when: [\"reqest.path == '/'\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "undeclared reference to 'reqest'"},
	}, {
		name: "a condition that is not a bool",
		doc:  rule("    match: {when: [\"request.path\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "must be a condition (of type bool), but is of type string"},
	}, {
		name: "a condition too costly",
		doc:  rule("    match: {when: [\"request.headers.all(a, request.headers.all(b, request.headers[a] != request.headers[b]))\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "estimated worst-case cost", "exceeds the limit 1000000"},
	}, {
		name: "a bad regular expression literal in a condition",
		doc:  rule("    match: {when: [\"request.path.matches('(')\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "not a valid CEL expression"},
	}, {
		name: "claims without a jwt section",
		doc:  rule("    match: {when: [\"auth.claims.sub == 'x'\"]}\n"),
		want: []string{"policies[0].rules[0].match.when[0]", "reads auth.claims, but the policy has no jwt section"},
	}, {
		name: "a key expression that computes a list",
		doc:  strings.Replace(rule(""), "key: [{clientIP: {}}]", `key: [{expression: "request.path.split('/')"}]`, 1),
		want: []string{"policies[0].rules[0].key[0].expression", "must compute a string, a number or a bool"},
	}, {
		name: "a key part with an expression and a header",
		doc:  strings.Replace(rule(""), "key: [{clientIP: {}}]", `key: [{expression: "request.path", header: X-A}]`, 1),
		want: []string{"policies[0].rules[0].key[0]", "set exactly one of", "expression; 2 are set"},
	}, {
		name: "a source CIDR with host bits",
		doc:  rule("    match: {sourceCIDRs: [10.1.2.3/8]}\n"),
		want: []string{"policies[0].rules[0].match.sourceCIDRs[0]", "must have no host bits set", "10.0.0.0/8"},
	}, {
		name: "not a CIDR",
		doc:  rule("    match: {sourceCIDRs: [10.0.0.1]}\n"),
		want: []string{"policies[0].rules[0].match.sourceCIDRs[0]", "must be a CIDR"},
	}, {
		name: "a host with a port",
		doc:  rule("    match: {hosts: [\"api.example.com:8080\"]}\n"),
		want: []string{"policies[0].rules[0].match.hosts[0]", "must be a lower-case DNS name"},
	}, {
		name: "a wildcard inside a host",
		doc:  rule("    match: {hosts: [\"api.*.example.com\"]}\n"),
		want: []string{"policies[0].rules[0].match.hosts[0]", "must be a lower-case DNS name"},
	}, {
		name: "a header match with value and regex",
		doc:  rule("    match: {headers: [{name: X-A, value: a, regex: b}]}\n"),
		want: []string{"policies[0].rules[0].match.headers[0]", "set at most one of value, regex and absent"},
	}, {
		name: "absent and invert",
		doc:  rule("    match: {headers: [{name: X-A, absent: true, invert: true}]}\n"),
		want: []string{"policies[0].rules[0].match.headers[0].invert", "cannot go with absent"},
	}, {
		name: "a header regex that does not compile",
		doc:  rule("    match: {headers: [{name: X-A, regex: \"(\"}]}\n"),
		want: []string{"policies[0].rules[0].match.headers[0].regex", "not a valid RE2 regular expression"},
	}, {
		name: "a query match without a name",
		doc:  rule("    match: {query: [{value: a}]}\n"),
		want: []string{"policies[0].rules[0].match.query[0].name", "must be 1-256"},
	}, {
		name: "an empty exemption",
		doc:  rule("    exempt: {}\n"),
		want: []string{"policies[0].rules[0].exempt", "set sourceCIDRs, when, or both"},
	}, {
		name: "a bad exemption condition",
		doc:  rule("    exempt: {when: [\"request.nope\"]}\n"),
		want: []string{"policies[0].rules[0].exempt.when[0]", "undeclared reference"},
	}, {
		name: "replacedBy naming no policy",
		doc:  rule("    replacedBy: [other]\n"),
		want: []string{"policies[0].rules[0].replacedBy[0]", `no policy of this document has uid "other"`},
	}, {
		name: "replacedBy naming its own policy",
		doc:  rule("    replacedBy: [p-uid]\n"),
		want: []string{"policies[0].rules[0].replacedBy[0]", "cannot replace its own rule"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load([]byte(tt.doc))
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDescriptorRulesTakeNoRequestMatching(t *testing.T) {
	t.Parallel()
	doc := `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: p-uid
  rules:
  - name: d
    match:
      descriptors: {domain: d, entries: [{key: k}]}
      hosts: [api.example.com]
      when: ["true"]
    limit: {requests: 10, per: 1s}
    exempt: {sourceCIDRs: [10.0.0.0/8]}
`
	_, err := Load([]byte(doc))
	if err == nil {
		t.Fatal("Load succeeded, want an error")
	}
	for _, w := range []string{
		"policies[0].rules[0].match: a descriptor rule matches Envoy rate-limit descriptors only",
		"policies[0].rules[0].exempt: a descriptor rule sees no request head",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestCompileExpression(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr          string
		kind          ExpressionKind
		claims, loops bool
	}{
		{"request.method == 'GET'", Condition, false, false},
		{"auth.claims.org.id == 'x'", Condition, true, false},
		{"request.headers.exists(h, h.startsWith('x-debug'))", Condition, false, true},
		{"request.query['page']", KeyValue, false, false},
		{"size(request.path)", KeyValue, false, false},
		{"auth.claims.sub", KeyValue, true, false},
	} {
		e, err := CompileExpression(tc.expr, tc.kind)
		if err != nil {
			t.Errorf("CompileExpression(%q) = %v", tc.expr, err)
			continue
		}
		if e.Claims != tc.claims || e.Loops != tc.loops {
			t.Errorf("CompileExpression(%q): claims %v loops %v, want %v %v", tc.expr, e.Claims, e.Loops, tc.claims, tc.loops)
		}
		if e.Cost == 0 || e.Cost > MaxExpressionCost {
			t.Errorf("CompileExpression(%q): cost %d", tc.expr, e.Cost)
		}
	}
	if _, err := CompileExpression(strings.Repeat("a", MaxExpressionLength+1), Condition); err == nil ||
		!strings.Contains(err.Error(), "at most 2048 characters") {
		t.Errorf("an overlong expression: %v", err)
	}
	if _, err := CompileExpression("  ", Condition); err == nil || !strings.Contains(err.Error(), "must not be empty") {
		t.Errorf("an empty expression: %v", err)
	}
}
