package runner

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// conditionsPolicy limits the POSTs to api.example.com per organisation
// (a key expression), leaves health probes and an internal network alone,
// and counts the GETs of page 1 in a second rule, on a query match.
const conditionsPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  exempt: {sourceCIDRs: ["203.0.113.0/24"]}
  trustedProxies: {cidrs: [127.0.0.0/8]}
  rules:
  - name: orders
    match: {hosts: ["*.example.com"], when: ["request.method == 'POST'"]}
    key: [{expression: "request.headers['x-org']"}]
    limit: {requests: 2, per: 1h}
    exempt: {when: ["request.headers['x-probe'] == 'health'"]}
  - name: first-page
    match:
      methods: [GET]
      query: [{name: page, value: "1"}]
      headers: [{name: X-Debug, absent: true}]
    key: [{clientIP: {}}]
    limit: {requests: 1, per: 1h}
`

// Conditions, hosts, query and header matches, key expressions and
// exemptions decide the same on both HTTP fronts, over one kept-alive
// connection whose requests alternate between the rules, exempt and not,
// so that nothing one request computed (its host, its key, its client)
// leaks into the next. The usage report counts what the rules did.
func TestConditionsOnBothFronts(t *testing.T) {
	t.Parallel()
	for _, lean := range []bool{true, false} {
		name := "lean"
		if !lean {
			name = "net/http"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			be := echoBackend(t)
			var args []string
			if !lean {
				args = []string{"--lean-http1=false"}
			}
			sc := startSidecar(t, be.URL, conditionsPolicy, true, args...)
			c := dialRaw(t, sc)
			steps := []struct {
				what, req string
				status    int
			}{
				{"acme's first order", "POST /orders HTTP/1.1\r\nHost: API.example.com:443\r\nX-Org: acme\r\nContent-Length: 0\r\n\r\n", 200},
				{"a health probe of acme", "POST /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\nX-Probe: health\r\nContent-Length: 0\r\n\r\n", 200},
				{"acme's second order", "POST /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\nContent-Length: 0\r\n\r\n", 200},
				{"acme from the exempt network", "POST /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\nX-Forwarded-For: 203.0.113.9\r\nContent-Length: 0\r\n\r\n", 200},
				{"acme's third order", "POST /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\nContent-Length: 0\r\n\r\n", 429},
				{"globex's first order", "POST /orders HTTP/1.1\r\nHost: shop.example.com\r\nX-Org: globex\r\nContent-Length: 0\r\n\r\n", 200},
				{"acme on another host", "POST /orders HTTP/1.1\r\nHost: example.com\r\nX-Org: acme\r\nContent-Length: 0\r\n\r\n", 200},
				{"a GET of acme", "GET /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\n\r\n", 200},
				{"page 1", "GET /list?page=1 HTTP/1.1\r\nHost: x\r\n\r\n", 200},
				{"page 1 with X-Debug", "GET /list?page=1 HTTP/1.1\r\nHost: x\r\nX-Debug: 1\r\n\r\n", 200},
				{"page 2", "GET /list?page=2 HTTP/1.1\r\nHost: x\r\n\r\n", 200},
				{"page 1 again", "GET /list?sort=asc&page=1 HTTP/1.1\r\nHost: x\r\n\r\n", 429},
				{"acme's fourth order", "POST /orders HTTP/1.1\r\nHost: api.example.com\r\nX-Org: acme\r\nContent-Length: 0\r\n\r\n", 429},
			}
			for _, s := range steps {
				c.send(s.req)
				method := "GET"
				if s.req[0] == 'P' {
					method = "POST"
				}
				res, _ := c.read(method)
				if got := res.StatusCode; got != s.status {
					t.Errorf("%s: %d, want %d", s.what, got, s.status)
				}
			}

			res, err := http.Get(sc.admin + config.UsagePath)
			if err != nil {
				t.Fatal(err)
			}
			var usage config.Usage
			err = json.NewDecoder(res.Body).Decode(&usage)
			_ = res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			want := []config.RuleUsage{
				{Policy: "p", Rule: "first-page", Allowed: 1, Denied: 1},
				{Policy: "p", Rule: "orders", Allowed: 3, Denied: 2, Exempt: 2},
			}
			if !reflect.DeepEqual(usage.Rules, want) {
				t.Errorf("usage report rules = %+v, want %+v", usage.Rules, want)
			}
		})
	}
}
