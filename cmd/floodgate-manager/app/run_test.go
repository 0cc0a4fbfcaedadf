package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// startEnv starts envtest with the CRDs, or fails with how to run it.
func startEnv(t *testing.T) *envtest.Environment {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds kube-apiserver, etcd and kubectl")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if _, err := env.Start(); err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	return env
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// get polls url until it answers, and returns the first answer's code and
// body.
func get(ctx context.Context, t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	for {
		code, body, err := fetch(ctx, t, c, url, "")
		if err == nil {
			return code, body
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET %s: %v (last error: %v)", url, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestRunServesProbesAndMetrics runs the manager as main does, against a real
// API server, and checks the probes and both metrics modes.
func TestRunServesProbesAndMetrics(t *testing.T) {
	env := startEnv(t)

	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("secure=%v", secure), func(t *testing.T) {
			o := DefaultOptions()
			o.MetricsAddr, o.ProbeAddr, o.SecureMetrics = freeAddr(t), freeAddr(t), secure
			o.LeaderElect, o.LeaderElectionNamespace = true, "default"
			o.LeaderElectionID = fmt.Sprintf("floodgate-manager-test-%v", secure)
			o.skipNameValidation = true
			// The webhook server and its self-managed certificate: a free
			// port, a private directory, a namespace envtest has.
			_, port, _ := net.SplitHostPort(freeAddr(t))
			o.Webhook.Port, _ = strconv.Atoi(port)
			o.Webhook.Namespace, o.Webhook.CertDir = "default", t.TempDir()

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, env.Config, o)
				cancel() // a Run that fails early ends the polling below
			}()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run() = %v, want nil after cancel", err)
				}
			})

			httpc := &http.Client{Timeout: 5 * time.Second}
			if code, body := get(ctx, t, httpc, "http://"+o.ProbeAddr+"/healthz"); code != http.StatusOK {
				t.Errorf("/healthz = %d %q, want 200", code, body)
			}
			for {
				code, _ := get(ctx, t, httpc, "http://"+o.ProbeAddr+"/readyz")
				if code == http.StatusOK {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}

			if !secure {
				// The controller starts once this replica leads; its
				// concurrency comes from --policy-concurrency. The
				// CounterStore metrics are served with controller-runtime's:
				// a store nothing answers for is not Ready.
				scheme, err := NewScheme()
				if err != nil {
					t.Fatal(err)
				}
				c, err := client.New(env.Config, client.Options{Scheme: scheme})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Create(ctx, &v1alpha1.CounterStore{
					ObjectMeta: metav1.ObjectMeta{Name: "run-metrics"},
					Spec:       v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{v1alpha1.HostPort(freeAddr(t))}}},
				}); err != nil {
					t.Fatal(err)
				}
				wants := []string{
					`controller_runtime_max_concurrent_reconciles{controller="ratelimitpolicy"} 4`,
					`floodgate_counterstore_ready{store="run-metrics"} 0`,
				}
				for {
					code, body := get(ctx, t, httpc, "http://"+o.MetricsAddr+"/metrics")
					if code != http.StatusOK {
						t.Fatalf("/metrics = %d, want 200", code)
					}
					missing := slices.DeleteFunc(slices.Clone(wants), func(w string) bool { return strings.Contains(body, w) })
					if len(missing) == 0 {
						return
					}
					select {
					case <-ctx.Done():
						t.Fatalf("/metrics never reported %q", missing)
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			// Secure metrics answer only callers the API server
			// authenticates and authorizes: an anonymous scrape is
			// refused, a ServiceAccount allowed to get /metrics scrapes,
			// one without that right is forbidden.
			tlsc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the certificate is self-signed
			}}
			url := "https://" + o.MetricsAddr + "/metrics"
			if code, body := get(ctx, t, tlsc, url); code != http.StatusUnauthorized {
				t.Errorf("anonymous /metrics over HTTPS = %d %q, want 401", code, body)
			}
			reader, stranger := metricsAccount(ctx, t, env, true), metricsAccount(ctx, t, env, false)
			if code, body := getWithToken(ctx, t, tlsc, url, reader); code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
				t.Errorf("/metrics over HTTPS with a reader's token = %d, want 200 with the metrics; body:\n%.300s", code, body)
			}
			if code, body := getWithToken(ctx, t, tlsc, url, stranger); code != http.StatusForbidden {
				t.Errorf("/metrics over HTTPS with the token of a user without the right = %d %q, want 403", code, body)
			}
		})
	}
}

// metricsAccount creates a ServiceAccount, bound when reader to a
// ClusterRole that allows get on the non-resource URL /metrics, and
// returns a token for it from the TokenRequest API.
func metricsAccount(ctx context.Context, t *testing.T, env *envtest.Environment, reader bool) string {
	t.Helper()
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "scraper-"}}
	if err := c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if reader {
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: sa.Name},
			Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sa.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
		}
		for _, o := range []client.Object{role, binding} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		// The manager caches a denial for 30s: scrape only once the API
		// server's RBAC cache has the binding.
		user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:                  user,
				Groups:                []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
				NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
			}}
			if err := c.Create(ctx, sar); err != nil {
				return false, err
			}
			return sar.Status.Allowed, nil
		})
		if err != nil {
			t.Fatalf("the API server never allowed %s to get /metrics: %v", user, err)
		}
	}
	tr := &authenticationv1.TokenRequest{}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("request a token for %s: %v", sa.Name, err)
	}
	if tr.Status.Token == "" {
		t.Fatalf("the TokenRequest for %s returned no token", sa.Name)
	}
	return tr.Status.Token
}

// getWithToken gets url with a bearer token and returns the answer's code
// and body.
func getWithToken(ctx context.Context, t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	code, body, err := fetch(ctx, t, c, url, token)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return code, body
}

// fetch gets url, with a bearer token unless token is empty, and returns
// the answer's code and body, or the error of the request.
func fetch(ctx context.Context, t *testing.T, c *http.Client, url, token string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	body, rerr := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); rerr == nil {
		rerr = cerr
	}
	if rerr != nil {
		t.Fatalf("read %s: %v", url, rerr)
	}
	return resp.StatusCode, string(body), nil
}
