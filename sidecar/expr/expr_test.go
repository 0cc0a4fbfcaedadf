package expr

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// head is an Input built from fixed values.
type head struct {
	method, path, host, source string
	header                     http.Header
	query                      map[string]string
	claims                     map[string]any
}

func (h *head) Method() string                     { return h.method }
func (h *head) Path() string                       { return h.path }
func (h *head) Host() string                       { return h.host }
func (h *head) SourceAddress() string              { return h.source }
func (h *head) Claims() map[string]any             { return h.claims }
func (h *head) HeaderValues(c string) []string     { return h.header[c] }
func (h *head) QueryValue(n string) (string, bool) { v, ok := h.query[n]; return v, ok }
func (h *head) Query() map[string]string           { return h.query }
func (h *head) HeadSize() int {
	n := len(h.method) + len(h.path)
	for k, v := range h.query {
		n += len(k) + len(v) + 2
	}
	for k, vs := range h.header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	for _, v := range h.claims {
		if l, ok := v.([]any); ok {
			n += 2 * len(l)
		}
	}
	return n
}

func (h *head) Headers() map[string]string {
	m := map[string]string{}
	for k, vs := range h.header {
		if len(vs) > 0 {
			m[strings.ToLower(k)] = strings.Join(vs, ",")
		}
	}
	return m
}

// conditions are the shapes the translation knows, and a few it does not.
var conditions = []string{
	`request.method == 'GET'`,
	`request.method != 'GET'`,
	`'GET' == request.method`,
	`request.method in ['GET', 'HEAD']`,
	`request.path.startsWith('/api/')`,
	`request.path.endsWith('.json')`,
	`request.path.contains('admin')`,
	`request.path.matches('^/api/v[0-9]+/')`,
	`matches(request.path, 'v2')`,
	`request.host == 'api.example.com'`,
	`request.host.endsWith('.example.com')`,
	`source.address == '10.0.0.1'`,
	`request.headers['x-tier'] == 'free'`,
	`request.headers['X-Tier'] == 'free'`,
	`request.headers['x-tier'] != 'free'`,
	`request.headers.accept == '*/*'`,
	`has(request.headers.accept)`,
	`'x-tier' in request.headers`,
	`'X-Tier' in request.headers`,
	`!('x-debug' in request.headers)`,
	`request.headers['x-multi'] == 'a,b'`,
	`request.query['page'] == '2'`,
	`'page' in request.query`,
	`has(request.query.debug)`,
	`request.query['debug'].startsWith('t')`,
	`!(request.headers['x-tier'] == 'free')`,
	`request.headers['x-tier'] == 'free' || request.method == 'POST'`,
	`request.method == 'POST' || request.headers['x-tier'] == 'free'`,
	`request.headers['x-tier'] == 'free' && request.method == 'POST'`,
	`request.method == 'POST' && request.headers['x-tier'] == 'free'`,
	`request.path.startsWith('/api/') && request.method in ['GET', 'POST'] && request.headers['x-tier'] == 'free'`,
	`true`,
	`false || !false`,
	// Not translated: the interpreter runs these.
	`size(request.path) > 5`,
	`request.headers.exists(h, h.startsWith('x-'))`,
	`request.path.lowerAscii().startsWith('/api')`,
	`cidr('10.0.0.0/8').containsIP(source.address)`,
	`auth.claims.tier == 'gold'`,
	`has(auth.claims.sub) && auth.claims.level >= 3`,
}

func requests(n int) []*head {
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	out := make([]*head, n)
	for i := range out {
		h := &head{
			method: pick("GET", "POST", "HEAD", "DELETE"),
			path:   pick("/", "/api/v1/users", "/api/v2/x.json", "/admin", "/API/v1", "/static/a.json"),
			host:   pick("api.example.com", "www.example.com", "example.org", ""),
			source: pick("10.0.0.1", "10.2.3.4", "192.0.2.7", "2001:db8::1", "", "not-an-ip"),
			header: http.Header{},
			query:  map[string]string{},
		}
		if r.IntN(2) == 0 {
			h.header["X-Tier"] = []string{pick("free", "gold", "")}
		}
		if r.IntN(3) == 0 {
			h.header["Accept"] = []string{"*/*"}
		}
		if r.IntN(3) == 0 {
			h.header["X-Debug"] = []string{"1"}
		}
		if r.IntN(4) == 0 {
			h.header["X-Multi"] = []string{"a", "b"}
		}
		if r.IntN(5) == 0 {
			h.header["X-Empty"] = []string{}
		}
		if r.IntN(2) == 0 {
			h.query["page"] = pick("1", "2")
		}
		if r.IntN(3) == 0 {
			h.query["debug"] = pick("true", "false")
		}
		if r.IntN(2) == 0 {
			h.claims = map[string]any{"sub": "u1", "tier": pick("gold", "free"), "level": float64(r.IntN(5))}
		}
		out[i] = h
	}
	return out
}

// interpreted compiles src for the interpreter only.
func interpreted(t *testing.T, src string, kind config.ExpressionKind) *Program {
	t.Helper()
	e, err := config.CompileExpression(src, kind)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	prg, err := program(e)
	if err != nil {
		t.Fatal(err)
	}
	return &Program{kind: kind, interp: []cel.Program{prg}, srcs: []string{src}}
}

// The translation into Go and the interpreter agree on every condition
// and every generated request.
func TestTranslationAgreesWithTheInterpreter(t *testing.T) {
	t.Parallel()
	reqs := requests(400)
	translated := 0
	for _, src := range conditions {
		native, err := CompileConditions([]string{src})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if n, _ := native.Native(); n == 1 {
			translated++
		}
		ref := interpreted(t, src, config.Condition)
		holds := 0
		for i, h := range reqs {
			var a, b Activation
			a.Reset(h)
			b.Reset(h)
			got, want := native.Holds(&a), ref.Holds(&b)
			if got != want {
				t.Errorf("%s on request %d (%+v): native %v, interpreter %v", src, i, *h, got, want)
				break
			}
			if got {
				holds++
			}
		}
		if holds == 0 && src != "false || !false" && !strings.Contains(src, "X-Tier") {
			t.Logf("%s never holds on the generated requests", src)
		}
	}
	if got, want := translated, 33; got != want {
		t.Errorf("%d of %d conditions translated into Go, want %d", got, len(conditions), want)
	}
}

// The conditions of the benchmark's policy and the usual ones run as Go.
func TestCommonConditionsRunAsGo(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		`request.path.startsWith('/api/')`,
		`request.method in ['GET', 'HEAD']`,
		`request.headers['x-tier'] == 'free'`,
		`!has(request.headers.authorization)`,
		`request.host == 'api.example.com' || request.host.endsWith('.example.com')`,
	} {
		p, err := CompileConditions([]string{src})
		if err != nil {
			t.Fatal(err)
		}
		if n, total := p.Native(); n != total {
			t.Errorf("%s runs in the interpreter", src)
		}
	}
}

func TestHoldsNeedsEveryCondition(t *testing.T) {
	t.Parallel()
	p, err := CompileConditions([]string{"request.method == 'GET'", "size(request.path) > 3", "request.headers['x-tier'] == 'free'"})
	if err != nil {
		t.Fatal(err)
	}
	if n, total := p.Native(); n != 2 || total != 3 {
		t.Errorf("Native() = %d, %d, want 2, 3", n, total)
	}
	for _, tc := range []struct {
		h    *head
		want bool
	}{
		{&head{method: "GET", path: "/abcd", header: http.Header{"X-Tier": {"free"}}}, true},
		{&head{method: "POST", path: "/abcd", header: http.Header{"X-Tier": {"free"}}}, false},
		{&head{method: "GET", path: "/a", header: http.Header{"X-Tier": {"free"}}}, false},
		{&head{method: "GET", path: "/abcd", header: http.Header{}}, false},
	} {
		var a Activation
		a.Reset(tc.h)
		if got := p.Holds(&a); got != tc.want {
			t.Errorf("Holds(%+v) = %v, want %v", *tc.h, got, tc.want)
		}
	}
	var a Activation
	a.Reset(&head{})
	if !(*Program)(nil).Holds(&a) {
		t.Error("a nil Program does not hold")
	}
	if empty, _ := CompileConditions(nil); !empty.Holds(&a) {
		t.Error("no conditions do not hold")
	}
}

func TestKeyValues(t *testing.T) {
	t.Parallel()
	h := &head{
		method: "GET", path: "/api/v1/x", source: "10.0.0.1",
		header: http.Header{"X-Org": {"acme"}, "X-Multi": {"a", "b"}, "X-Long": {strings.Repeat("x", config.MaxKeyValueLength+1)}},
		query:  map[string]string{"page": "2"},
		claims: map[string]any{"sub": "u1", "n": float64(42), "f": 1.5, "ok": true, "list": []any{"a"}},
	}
	for _, tc := range []struct {
		src    string
		want   string
		ok     bool
		native bool
	}{
		{`request.headers['x-org']`, "acme", true, true},
		{`request.headers['x-multi']`, "a,b", true, true},
		{`request.headers['x-none']`, "", false, true},
		{`request.query['page']`, "2", true, true},
		{`request.path`, "/api/v1/x", true, true},
		{`request.headers['x-org'] + ':' + request.path`, "acme:/api/v1/x", true, false},
		{`size(request.path)`, "9", true, false},
		{`auth.claims.sub`, "u1", true, false},
		{`auth.claims.n`, "42", true, false},
		{`auth.claims.f`, "1.5", true, false},
		{`auth.claims.ok`, "true", true, false},
		{`auth.claims.list`, "", false, false},
		{`auth.claims.missing`, "", false, false},
		{`request.headers['x-long']`, "", false, true},
		{`request.path + request.headers['x-long']`, "", false, false},
	} {
		p, err := CompileKey(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		if n, _ := p.Native(); (n == 1) != tc.native {
			t.Errorf("%s: native %v, want %v", tc.src, n == 1, tc.native)
		}
		var a Activation
		a.Reset(h)
		got, ok := p.AppendValue([]byte("prefix:"), &a)
		if ok != tc.ok || (ok && string(got) != "prefix:"+tc.want) || (!ok && string(got) != "prefix:") {
			t.Errorf("%s = %q, %v; want %q, %v", tc.src, got, ok, "prefix:"+tc.want, tc.ok)
		}
	}
}

// A condition that loops runs only on a request head within the size its
// cost estimate assumes; on a larger one it does not hold, and a key
// expression that loops gives no value.
func TestLoopsRunOnlyOnBoundedHeads(t *testing.T) {
	t.Parallel()
	p, err := CompileConditions([]string{`request.headers.all(k, !k.startsWith('x-forbidden'))`})
	if err != nil {
		t.Fatal(err)
	}
	small := http.Header{"X-A": {"1"}}
	big := http.Header{"X-A": {strings.Repeat("v", config.HeadBytes)}}
	var a Activation
	a.Reset(&head{header: small})
	if !p.Holds(&a) {
		t.Error("the loop did not hold on a small head")
	}
	a.Reset(&head{header: big})
	if p.Holds(&a) {
		t.Errorf("the loop held on a head above %d bytes", config.HeadBytes)
	}
	k, err := CompileKey(`request.headers.filter(k, k.startsWith('x-')).size()`)
	if err != nil {
		t.Fatal(err)
	}
	a.Reset(&head{header: small})
	if v, ok := k.AppendValue(nil, &a); !ok || string(v) != "1" {
		t.Errorf("key on a small head = %q, %v; want 1, true", v, ok)
	}
	a.Reset(&head{header: big})
	if _, ok := k.AppendValue(nil, &a); ok {
		t.Error("a looping key expression gave a value on a head above the bound")
	}
}
