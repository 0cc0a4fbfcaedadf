package metricsauth

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// The suite's API server and what TestMain sets up on it.
var (
	env *envtest.Environment
	k8s client.Client
	// roles are the ClusterRoles of config/rbac/role.yaml, by name.
	roles map[string]*rbacv1.ClusterRole
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds kube-apiserver, etcd and kubectl")
		return 1
	}
	var err error
	if roles, err = generatedRoles(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env = &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	for _, name := range []string{"floodgate-manager-metrics-auth", "floodgate-metrics-reader"} {
		if err := k8s.Create(ctx, roles[name].DeepCopy()); err != nil {
			fmt.Fprintf(os.Stderr, "create ClusterRole %s: %v\n", name, err)
			return 1
		}
	}
	return m.Run()
}

// generatedRoles reads the ClusterRoles that controller-gen writes from
// the +kubebuilder:rbac markers.
func generatedRoles() (map[string]*rbacv1.ClusterRole, error) {
	path := filepath.Join("..", "..", "config", "rbac", "role.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]*rbacv1.ClusterRole{}
	for doc := range strings.SplitSeq(string(raw), "\n---") {
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.Kind == "ClusterRole" {
			out[r.Name] = &r
		}
	}
	for _, name := range []string{"floodgate-manager-metrics-auth", "floodgate-metrics-reader"} {
		if out[name] == nil {
			return nil, fmt.Errorf("%s has no ClusterRole %s: run make manifests", path, name)
		}
	}
	return out, nil
}

// account creates a ServiceAccount in a namespace of its own, bound to
// the ClusterRoles named, and returns a token for it from the TokenRequest
// API and its user name.
func account(t *testing.T, name string, clusterRoles ...string) (token, user string) {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metricsauth-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}}
	if err := k8s.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	for _, r := range clusterRoles {
		bind(t, sa, r)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := k8s.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("request a token for %s: %v", name, err)
	}
	if tr.Status.Token == "" {
		t.Fatalf("the TokenRequest for %s returned no token", name)
	}
	return tr.Status.Token, "system:serviceaccount:" + ns.Name + ":" + name
}

// bind binds the ClusterRole named role to sa.
func bind(t *testing.T, sa *corev1.ServiceAccount, role string) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: sa.Name + "-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: sa.Namespace, Name: sa.Name}},
	}
	if err := k8s.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
}

// reviewCounter counts the reviews that reach the API server.
type reviewCounter struct {
	next                   http.RoundTripper
	tokenReviews, accessRs atomic.Int64
}

func (c *reviewCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(req.URL.Path, "/tokenreviews"):
		c.tokenReviews.Add(1)
	case strings.HasSuffix(req.URL.Path, "/subjectaccessreviews"):
		c.accessRs.Add(1)
	}
	return c.next.RoundTrip(req)
}

func (c *reviewCounter) counts() string {
	return fmt.Sprintf("%d TokenReviews, %d SubjectAccessReviews", c.tokenReviews.Load(), c.accessRs.Load())
}

// guarded serves "metrics" behind the filter, which reviews as the
// ServiceAccount whose token is managerToken, and returns the server's
// URL, the review counter and the clock.
func guarded(t *testing.T, managerToken string, opts Options) (string, *reviewCounter, *clocktesting.FakeClock) {
	t.Helper()
	cfg := &rest.Config{
		Host:            env.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData},
		BearerToken:     managerToken,
	}
	return guardedWith(t, cfg, opts)
}

func guardedWith(t *testing.T, cfg *rest.Config, opts Options) (string, *reviewCounter, *clocktesting.FakeClock) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	counter := &reviewCounter{next: hc.Transport}
	hc.Transport = counter
	clock := clocktesting.NewFakeClock(time.Now())
	filter, err := newFilter(cfg, hc, opts, clock)
	if err != nil {
		t.Fatal(err)
	}
	h, err := filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Errorf("the metrics handler received the caller's token")
		}
		_, _ = io.WriteString(w, "metrics")
	}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL, counter, clock
}

// call sends method url with the Authorization header auth (none when
// empty) and returns the status and body.
func call(t *testing.T, method, url, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// TestAnswers runs every kind of caller against the filter, which reviews
// with the rights of the generated floodgate-manager-metrics-auth
// ClusterRole: the scraper holds the generated floodgate-metrics-reader.
func TestAnswers(t *testing.T) {
	t.Parallel()
	managerToken, _ := account(t, "manager", "floodgate-manager-metrics-auth")
	scraper, _ := account(t, "scraper", "floodgate-metrics-reader")
	stranger, strangerUser := account(t, "stranger")
	url, _, _ := guarded(t, managerToken, Options{})

	for _, tt := range []struct {
		name         string
		method, path string
		auth         string
		code         int
		body         string
	}{
		{"no token", http.MethodGet, "/metrics", "", http.StatusUnauthorized, "Unauthorized"},
		{"basic auth", http.MethodGet, "/metrics", "Basic c2NyYXBlcjpwdw==", http.StatusUnauthorized, "Unauthorized"},
		{"empty bearer token", http.MethodGet, "/metrics", "Bearer ", http.StatusUnauthorized, "Unauthorized"},
		{"two spaces before the token", http.MethodGet, "/metrics", "Bearer  " + scraper, http.StatusUnauthorized, "Unauthorized"},
		{"token the API server rejects", http.MethodGet, "/metrics", "Bearer not-a-token", http.StatusUnauthorized, "Unauthorized"},
		{"a user without the reader role", http.MethodGet, "/metrics", "Bearer " + stranger, http.StatusForbidden, "Authorization denied for user " + strangerUser},
		{"the reader", http.MethodGet, "/metrics", "Bearer " + scraper, http.StatusOK, "metrics"},
		{"the reader, scheme in lower case", http.MethodGet, "/metrics", "bearer " + scraper, http.StatusOK, "metrics"},
		{"the reader on another path", http.MethodGet, "/debug/pprof", "Bearer " + scraper, http.StatusForbidden, ""},
		{"the reader with another verb", http.MethodPost, "/metrics", "Bearer " + scraper, http.StatusForbidden, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, tt.method, url+tt.path, tt.auth)
			if code != tt.code {
				t.Errorf("%s %s = %d %q, want %d", tt.method, tt.path, code, body, tt.code)
			}
			if tt.body != "" && body != tt.body {
				t.Errorf("%s %s body = %q, want %q", tt.method, tt.path, body, tt.body)
			}
		})
	}
}

// TestCaches checks that answers are reused for their TTL, and asked
// again after it.
func TestCaches(t *testing.T) {
	t.Parallel()
	managerToken, _ := account(t, "manager", "floodgate-manager-metrics-auth")
	scraper, _ := account(t, "scraper", "floodgate-metrics-reader")
	url, counter, clock := guarded(t, managerToken, Options{})

	want := func(step string, code int, auth string, tokenReviews, accessReviews int64) {
		t.Helper()
		if got, _ := call(t, http.MethodGet, url+"/metrics", auth); got != code {
			t.Errorf("%s: /metrics = %d, want %d", step, got, code)
		}
		if counter.tokenReviews.Load() != tokenReviews || counter.accessRs.Load() != accessReviews {
			t.Errorf("%s: %s, want %d and %d", step, counter.counts(), tokenReviews, accessReviews)
		}
	}
	want("first scrape", http.StatusOK, "Bearer "+scraper, 1, 1)
	want("second scrape", http.StatusOK, "Bearer "+scraper, 1, 1)
	clock.Step(DefaultTokenTTL - time.Second)
	want("just before the token TTL", http.StatusOK, "Bearer "+scraper, 1, 1)
	clock.Step(2 * time.Second)
	want("past the token TTL", http.StatusOK, "Bearer "+scraper, 2, 1)
	clock.Step(DefaultAllowTTL)
	want("past the allow TTL", http.StatusOK, "Bearer "+scraper, 3, 2)

	// A rejected token is cached too.
	want("a bad token", http.StatusUnauthorized, "Bearer bad-token", 4, 2)
	want("the bad token again", http.StatusUnauthorized, "Bearer bad-token", 4, 2)
	// A missing token costs no review.
	want("no token", http.StatusUnauthorized, "", 4, 2)
}

// TestDenialExpires checks that a denial is cached for DenyTTL only, so a
// scraper granted the reader role is let in within that time.
func TestDenialExpires(t *testing.T) {
	t.Parallel()
	managerToken, _ := account(t, "manager", "floodgate-manager-metrics-auth")
	token, user := account(t, "late-reader")
	url, _, clock := guarded(t, managerToken, Options{})

	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+token); code != http.StatusForbidden {
		t.Fatalf("before the grant: %d %q, want 403", code, body)
	}
	ns, name, _ := strings.Cut(strings.TrimPrefix(user, "system:serviceaccount:"), ":")
	bind(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, "floodgate-metrics-reader")
	// Wait until the API server's own RBAC cache has the new binding.
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, authenticatedGroup},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
		}}
		if err := k8s.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("the API server never allowed the granted reader: %v", err)
	}
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+token); code != http.StatusForbidden {
		t.Errorf("just after the grant: %d %q, want the cached 403", code, body)
	}
	clock.Step(DefaultDenyTTL - time.Second)
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+token); code != http.StatusForbidden {
		t.Errorf("just before the deny TTL: %d %q, want the cached 403", code, body)
	}
	clock.Step(2 * time.Second)
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+token); code != http.StatusOK {
		t.Errorf("past the deny TTL: %d %q, want 200", code, body)
	}
}

// TestCacheIsBounded checks that the least recently used answer goes
// when the cache is full.
func TestCacheIsBounded(t *testing.T) {
	t.Parallel()
	managerToken, _ := account(t, "manager", "floodgate-manager-metrics-auth")
	a, _ := account(t, "reader-a", "floodgate-metrics-reader")
	b, _ := account(t, "reader-b", "floodgate-metrics-reader")
	c, _ := account(t, "reader-c", "floodgate-metrics-reader")
	url, counter, _ := guarded(t, managerToken, Options{CacheSize: 2})
	for _, tok := range []string{a, b, c, c, b} {
		if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+tok); code != http.StatusOK {
			t.Fatalf("/metrics = %d %q, want 200", code, body)
		}
	}
	if got, want := counter.tokenReviews.Load(), int64(3); got != want {
		t.Errorf("after a, b, c, c, b: %d TokenReviews, want %d (c and b cached)", got, want)
	}
	if code, _ := call(t, http.MethodGet, url+"/metrics", "Bearer "+a); code != http.StatusOK {
		t.Errorf("a again = %d, want 200", code)
	}
	if got, want := counter.tokenReviews.Load(), int64(4); got != want {
		t.Errorf("a again: %d TokenReviews, want %d (a was evicted)", got, want)
	}
}

// TestReviewsFail checks the 500s: a manager that may not review, and an
// API server that does not answer.
func TestReviewsFail(t *testing.T) {
	t.Parallel()
	scraper, scraperUser := account(t, "scraper", "floodgate-metrics-reader")
	noRights, _ := account(t, "manager-without-rights")
	url, _, _ := guarded(t, noRights, Options{})
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+scraper); code != http.StatusInternalServerError || body != "Authentication failed" {
		t.Errorf("a manager that may not create TokenReviews: %d %q, want 500 \"Authentication failed\"", code, body)
	}

	// A manager that may authenticate but not authorize.
	reviewOnly := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "token-reviewer-"},
		Rules:      roles["floodgate-manager-metrics-auth"].Rules[:1],
	}
	if got := reviewOnly.Rules[0].Resources; len(got) != 1 || got[0] != "tokenreviews" {
		t.Fatalf("the generated role's first rule is %v, want tokenreviews", got)
	}
	if err := k8s.Create(t.Context(), reviewOnly); err != nil {
		t.Fatal(err)
	}
	halfRights, _ := account(t, "manager-half-rights", reviewOnly.Name)
	url, _, _ = guarded(t, halfRights, Options{})
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+scraper); code != http.StatusInternalServerError || body != "Authorization for user "+scraperUser+" failed" {
		t.Errorf("a manager that may not create SubjectAccessReviews: %d %q, want 500 naming the user", code, body)
	}

	// Nothing listens at the API server's address: the review fails once
	// the retries are spent.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	url, counter, _ := guardedWith(t, &rest.Config{Host: dead, BearerToken: "x", TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		Options{Backoff: wait.Backoff{Duration: 10 * time.Millisecond, Steps: 3}})
	if code, body := call(t, http.MethodGet, url+"/metrics", "Bearer "+scraper); code != http.StatusInternalServerError {
		t.Errorf("an unreachable API server: %d %q, want 500", code, body)
	}
	if got := counter.tokenReviews.Load(); got != 1 {
		t.Errorf("an unreachable API server: %d TokenReview attempts, want 1 (a refused connection is not retried)", got)
	}
	// Failures are not cached: the next scrape asks again.
	_, _ = call(t, http.MethodGet, url+"/metrics", "Bearer "+scraper)
	if got := counter.tokenReviews.Load(); got != 2 {
		t.Errorf("after a second scrape: %d TokenReview attempts, want 2", got)
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"  Bearer abc  ", "abc", true},
		{"Bearer abc def", "abc", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer  abc", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
	} {
		token, ok := bearerToken(tt.header)
		if token != tt.token || ok != tt.ok {
			t.Errorf("bearerToken(%q) = %q, %v; want %q, %v", tt.header, token, ok, tt.token, tt.ok)
		}
	}
}
