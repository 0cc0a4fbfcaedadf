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
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
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
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			if cerr := resp.Body.Close(); rerr == nil {
				rerr = cerr
			}
			if rerr != nil {
				t.Fatalf("read %s: %v", url, rerr)
			}
			return resp.StatusCode, string(body)
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
				// concurrency comes from --policy-concurrency.
				want := `controller_runtime_max_concurrent_reconciles{controller="ratelimitpolicy"} 4`
				for {
					code, body := get(ctx, t, httpc, "http://"+o.MetricsAddr+"/metrics")
					if code != http.StatusOK {
						t.Fatalf("/metrics = %d, want 200", code)
					}
					if strings.Contains(body, want) {
						return
					}
					select {
					case <-ctx.Done():
						t.Fatalf("/metrics never reported %s", want)
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			// Secure metrics answer only callers the API server
			// authenticates: an anonymous scrape is refused.
			tlsc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the certificate is self-signed
			}}
			if code, body := get(ctx, t, tlsc, "https://"+o.MetricsAddr+"/metrics"); code != http.StatusUnauthorized {
				t.Errorf("anonymous /metrics over HTTPS = %d %q, want 401", code, body)
			}
		})
	}
}
