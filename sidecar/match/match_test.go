package match

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
)

// rulesOf makes every match a rule of policy pol.
func rulesOf(tb testing.TB, ms []config.Match, pol *descriptor.Policy) []Rule {
	tb.Helper()
	out := make([]Rule, len(ms))
	for i, m := range ms {
		out[i] = Rule{Match: m, Policy: pol}
	}
	return out
}

// request builds the descriptor.Request of a request from 192.0.2.1 under
// npolicies policies. target may carry a query.
func request(method, target string, h http.Header, npolicies int) *descriptor.Request {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = "192.0.2.1:4321"
	for k, vs := range h {
		req.Header[k] = vs
	}
	var r descriptor.Request
	r.Reset(req, CleanPath(req.URL.Path), npolicies)
	return &r
}

func TestMatch(t *testing.T) {
	t.Parallel()
	ms := []config.Match{
		0: {},
		1: {Path: &config.PathMatch{Type: config.PathExact, Value: "/login"}},
		2: {Path: &config.PathMatch{Type: config.PathPrefix, Value: "/api/"}},
		3: {Path: &config.PathMatch{Type: config.PathPrefix, Value: "/api/v1"}, Methods: []string{"POST", "PURGE"}},
		4: {Path: &config.PathMatch{Type: config.PathRegularExpression, Value: `/api/v1/users/\d+`}},
		5: {Path: &config.PathMatch{Type: config.PathRegularExpression, Value: `/(a|b)/x`}},
		6: {Headers: []config.HeaderMatch{{Name: "x-tier", Value: "free"}, {Name: "X-Key"}}},
		7: {Path: &config.PathMatch{Type: config.PathPrefix, Value: "/"}},
		8: {Path: &config.PathMatch{Type: config.PathRegularExpression, Value: `(?i)/CASE`}},
	}
	m, err := New(rulesOf(t, ms, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, method string
		h            http.Header
		want         []int
	}{
		{"/login", "GET", nil, []int{0, 1, 7}},
		{"/login/", "GET", nil, []int{0, 1, 7}},
		{"/LOGIN", "GET", nil, []int{0, 1, 7}},
		{"/Login/", "GET", nil, []int{0, 1, 7}},
		{"/loginx", "GET", nil, []int{0, 7}},
		{"/API/V1/Users/42/", "GET", nil, []int{0, 2, 4, 7}},
		{"/B/X", "GET", nil, []int{0, 5, 7}},
		{"/api", "GET", nil, []int{0, 2, 7}},
		{"/apix", "GET", nil, []int{0, 7}},
		{"/api/v1", "POST", nil, []int{0, 2, 3, 7}},
		{"/api/v1", "PURGE", nil, []int{0, 2, 3, 7}},
		{"/api/v1", "GET", nil, []int{0, 2, 7}},
		{"/api/v1x", "POST", nil, []int{0, 2, 7}},
		{"/api/v1/users/42", "GET", nil, []int{0, 2, 4, 7}},
		{"/api/v1/users/42/x", "GET", nil, []int{0, 2, 7}},
		{"/a/x", "GET", nil, []int{0, 5, 7}},
		{"/b/x", "GET", nil, []int{0, 5, 7}},
		{"/c/x", "GET", nil, []int{0, 7}},
		{"/case", "GET", nil, []int{0, 7, 8}},
		{"/x", "GET", http.Header{"X-Tier": {"free"}, "X-Key": {"k"}}, []int{0, 6, 7}},
		{"/x", "GET", http.Header{"X-Tier": {"paid", "free"}, "X-Key": {""}}, []int{0, 6, 7}},
		{"/x", "GET", http.Header{"X-Tier": {"paid"}, "X-Key": {"k"}}, []int{0, 7}},
		{"/x", "GET", http.Header{"X-Tier": {"free"}}, []int{0, 7}},
	} {
		got := m.Match(request(tc.method, tc.path, tc.h, 1), nil)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Match(%q, %s, %v) = %v, want %v", tc.path, tc.method, tc.h, got, tc.want)
		}
	}
}

// gRPC services and methods are paths (/<package>.<Service>/<Method>, an
// HTTP/2 POST), which the sidecar and the central rate-limit service
// match alike: a method by an Exact path, a service by a Prefix, a method
// of any service by a RegularExpression.
func TestMatchGRPCMethods(t *testing.T) {
	t.Parallel()
	m, err := New(rulesOf(t, []config.Match{
		0: {Path: &config.PathMatch{Type: config.PathExact, Value: "/shop.v1.Orders/Create"}},
		1: {Path: &config.PathMatch{Type: config.PathPrefix, Value: "/shop.v1.Orders"}},
		2: {Path: &config.PathMatch{Type: config.PathRegularExpression, Value: `/[^/]+/Delete`}},
	}, nil))
	if err != nil {
		t.Fatal(err)
	}
	grpc := http.Header{"Content-Type": {"application/grpc"}}
	for _, tc := range []struct {
		path string
		want []int
	}{
		{"/shop.v1.Orders/Create", []int{0, 1}},
		{"/shop.v1.Orders/Get", []int{1}},
		{"/shop.v1.Orders/Delete", []int{1, 2}},
		{"/shop.v1.Orders/CreateBatch", []int{1}},
		{"/shop.v1.OrdersAdmin/Create", nil},
		{"/shop.v2.Orders/Create", nil},
		{"/shop.v1.Users/Delete", []int{2}},
		{"/shop.v1.Users/DeleteAll", nil},
		// Names compare without regard to case, as every path does.
		{"/shop.v1.orders/create", []int{0, 1}},
	} {
		got := m.Match(request(http.MethodPost, tc.path, grpc, 1), nil)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Match(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// Paths that an application serves alike match alike: case and a trailing
// slash do not sidestep a rule (the bypass of issue 18: /login/ and /LOGIN
// skipped an Exact /login rule).
func TestMatchIgnoresCaseAndTrailingSlash(t *testing.T) {
	m, err := New(rulesOf(t, []config.Match{
		{Path: &config.PathMatch{Type: config.PathExact, Value: "/login"}},
		{Path: &config.PathMatch{Type: config.PathPrefix, Value: "/Admin/"}},
		{Path: &config.PathMatch{Type: config.PathRegularExpression, Value: `/reset/[a-z]+`}},
	}, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want []int
	}{
		{"/login", []int{0}}, {"/login/", []int{0}}, {"/LOGIN", []int{0}}, {"/LoGiN/", []int{0}},
		{"/admin", []int{1}}, {"/ADMIN/users", []int{1}}, {"/admin/", []int{1}},
		{"/reset/abc", []int{2}}, {"/RESET/ABC/", []int{2}},
		{"/logins", nil}, {"/administrator", nil}, {"/reset/", nil},
	} {
		got := m.Match(request("GET", tc.path, nil, 1), nil)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Match(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	for in, want := range map[string]string{"/Login/": "/login", "/": "/", "/A/b/C": "/a/b/c"} {
		if got := string(descriptor.AppendNormalizedPath(nil, in)); got != want {
			t.Errorf("AppendNormalizedPath(%q) = %q, want %q", in, got, want)
		}
	}
	dst := make([]int, 0, 4)
	r := request("GET", "/ADMIN/Users/42", nil, 1)
	allocs := testing.AllocsPerRun(100, func() { dst = m.Match(r, dst[:0]) })
	if allocs != 0 {
		t.Errorf("Match allocates %v times, want 0", allocs)
	}
}

func TestCleanPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                "/",
		"/":               "/",
		"/a/b":            "/a/b",
		"/a/b/":           "/a/b/",
		"//admin":         "/admin",
		"/api/../admin":   "/admin",
		"/api/../admin/":  "/admin/",
		"/./a/./b/.":      "/a/b",
		"a/b":             "/a/b",
		"/a//b//":         "/a/b/",
		"/../../etc/pass": "/etc/pass",
	} {
		if got := CleanPath(in); got != want {
			t.Errorf("CleanPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkCleanPath(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		CleanPath("/api/v1/users/")
	}
}

func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			ms := make([]config.Match, n)
			for i := range ms {
				switch i % 3 {
				case 0:
					ms[i] = config.Match{Path: &config.PathMatch{Type: config.PathExact, Value: fmt.Sprintf("/svc%d/item", i)}}
				case 1:
					ms[i] = config.Match{Path: &config.PathMatch{Type: config.PathPrefix, Value: fmt.Sprintf("/svc%d/", i)}, Methods: []string{"GET"}}
				case 2:
					ms[i] = config.Match{Path: &config.PathMatch{Type: config.PathRegularExpression, Value: fmt.Sprintf(`/svc%d/items/\d+`, i)}}
				}
			}
			m, err := New(rulesOf(b, ms, nil))
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]int, 0, 8)
			r := request("GET", "/svc4/items/17", nil, 1)
			b.ReportAllocs()
			for b.Loop() {
				dst = m.Match(r, dst[:0])
			}
			if len(dst) != 1 {
				b.Fatalf("matched %v", dst)
			}
		})
	}
}

// The forms servers route as another path are matched as that path, and a
// clean path is returned as it is.
func TestMatchPath(t *testing.T) {
	// Not parallel: it counts allocations.
	for in, want := range map[string]string{
		"/admin":               "/admin",
		"/admin;jsessionid=1":  "/admin",
		"/a;x/b;y/":            "/a/b/",
		"/a;x/../admin":        "/admin",
		"/admin\\":             "/admin/",
		"\\admin":              "/admin",
		"/admin ":              "/admin",
		"/admin \t/x":          "/admin/x",
		"/my file.txt":         "/my file.txt",
		"/a/./b/../admin;v=2 ": "/a/admin",
		"/;x":                  "/",
	} {
		if got := MatchPath(in); got != want {
			t.Errorf("MatchPath(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = MatchPath("/api/v1/orders") }); n != 0 {
		t.Errorf("MatchPath of a clean path allocates %v times, want 0", n)
	}
}
