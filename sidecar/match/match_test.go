package match

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

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
	m, err := New(ms)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, method string
		h            http.Header
		want         []int
	}{
		{"/login", "GET", nil, []int{0, 1, 7}},
		{"/login/", "GET", nil, []int{0, 7}},
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
		got := m.Match(tc.path, tc.method, "", tc.h, nil)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Match(%q, %s, %v) = %v, want %v", tc.path, tc.method, tc.h, got, tc.want)
		}
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
			m, err := New(ms)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]int, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				dst = m.Match("/svc4/items/17", "GET", "", nil, dst[:0])
			}
			if len(dst) != 1 {
				b.Fatalf("matched %v", dst)
			}
		})
	}
}

func TestMatchHosts(t *testing.T) {
	t.Parallel()
	m, err := New([]config.Match{
		0: {Hosts: []string{"api.example.com", "*.shop.example.com"}},
		1: {},
		2: {Hosts: []string{"[::1]"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		want []int
	}{
		{"api.example.com", []int{0, 1}},
		{"API.EXAMPLE.COM:443", []int{0, 1}},
		{"api.example.com.", []int{0, 1}},
		{"a.shop.example.com", []int{0, 1}},
		{"a.b.shop.example.com:80", []int{0, 1}},
		{"shop.example.com", []int{1}},
		{"xshop.example.com", []int{1}},
		{"api.example.com.evil", []int{1}},
		{"", []int{1}},
		{"[::1]:8080", []int{1, 2}},
	} {
		if got := m.Match("/x", "GET", tc.host, nil, nil); !slices.Equal(got, tc.want) {
			t.Errorf("Match(host %q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}
