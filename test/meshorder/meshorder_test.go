// Package meshorder checks floodgate's sidecar where Istio puts it: behind
// the pod's mesh proxy. Istio's iptables send every inbound connection of
// the pod to its Envoy, which then connects to the pod's port, floodgate's
// listener, from 127.0.0.6; floodgate forwards to the application on
// loopback, which Istio's outbound rules leave alone (ISTIO_OUTPUT returns
// traffic to 127.0.0.1). So the order in the pod is: mesh proxy, then
// floodgate, then the application. The client's address reaches the pod
// only in the X-Forwarded-For that the ingress gateway appended.
//
// The test builds that chain over real sockets: clients on distinct
// loopback addresses, an ingress gateway that appends the peer to
// X-Forwarded-For (as Envoy does at the edge), a mesh inbound proxy that
// dials floodgate from 127.0.0.6 and passes X-Forwarded-For unchanged (as
// Istio's sidecar does), a real floodgate sidecar and an application. It
// shows the collapse that floodgate's admission warning is about, and the
// configuration docs/gateways.md gives for it.
package meshorder

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/simnode"
)

// meshPeer is the address Istio's inbound proxy connects to the pod's
// port from.
const meshPeer = "127.0.0.6"

// policy keys one rule on the client IP: 2 requests per hour each.
const policy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: per-client
  uid: mesh-%s
  replicas: 1
%s  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 2, per: 1h}
`

// chain is one pod behind the mesh, and the edge in front of it.
type chain struct {
	gateway string // the ingress gateway's URL
	mesh    string // the pod's mesh inbound proxy, reached without the gateway
	appHits *atomic.Int64
}

func TestClientIPBehindTheMeshProxy(t *testing.T) {
	t.Parallel()
	t.Run("without trustedProxies every client is the mesh proxy", func(t *testing.T) {
		t.Parallel()
		c := startChain(t, "plain", "")
		if got := codes(t, c.gateway, "127.0.0.21", 2); !equal(got, 200, 200) {
			t.Fatalf("client 127.0.0.21: %v, want 200 200", got)
		}
		// Another client is refused: its requests count under the key of
		// the peer, 127.0.0.6, which the first client has spent.
		if got := codes(t, c.gateway, "127.0.0.22", 1); !equal(got, 429) {
			t.Fatalf("client 127.0.0.22 after 127.0.0.21 spent the limit: %v, want 429 (one key for every client)", got)
		}
		if got := c.appHits.Load(); got != 2 {
			t.Errorf("the application saw %d requests, want the 2 admitted", got)
		}
	})
	t.Run("trusting the mesh proxy keys each client", func(t *testing.T) {
		t.Parallel()
		c := startChain(t, "trusted", "  trustedProxies: {cidrs: [127.0.0.6/32]}\n")
		for _, client := range []string{"127.0.0.21", "127.0.0.22"} {
			if got := codes(t, c.gateway, client, 3); !equal(got, 200, 200, 429) {
				t.Errorf("client %s: %v, want 200 200 429 (a key of its own)", client, got)
			}
		}
		if got := c.appHits.Load(); got != 4 {
			t.Errorf("the application saw %d requests, want the 4 admitted", got)
		}
		// What docs/gateways.md warns about: a client that reaches the
		// pod without the gateway (inside the mesh, without an
		// AuthorizationPolicy that admits only the gateway) names its
		// own address in X-Forwarded-For, and the trusted mesh proxy
		// passes it on.
		if got := forged(t, c.mesh, "127.0.0.23", "192.0.2.7", 3); !equal(got, 200, 200, 429) {
			t.Errorf("a forged X-Forwarded-For through the mesh proxy alone: %v, want it believed (200 200 429 under 192.0.2.7)", got)
		}
		if got := codes(t, c.gateway, "127.0.0.23", 1); !equal(got, 200) {
			t.Errorf("client 127.0.0.23 through the gateway after forging another address: %v, want 200 (its own key is untouched)", got)
		}
	})
}

// startChain starts the application, a floodgate sidecar with the policy
// (trusted is its trustedProxies line, or empty), the mesh inbound proxy
// in front of it and the ingress gateway in front of that.
func startChain(t *testing.T, name, trusted string) chain {
	t.Helper()
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(app.Close)
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pf, fmt.Appendf(nil, policy, name, trusted), 0o600); err != nil {
		t.Fatal(err)
	}
	sidecar := startSidecar(t, pf, app.URL)

	// Istio's inbound proxy: connects from 127.0.0.6, forwards
	// X-Forwarded-For as it came (Rewrite without SetXForwarded).
	mesh := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(sidecar)
			// ReverseProxy drops X-Forwarded-For before Rewrite; the
			// mesh proxy passes it on as it came.
			if xff := r.In.Header.Values("X-Forwarded-For"); len(xff) > 0 {
				r.Out.Header["X-Forwarded-For"] = xff
			}
		},
		Transport: &http.Transport{DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP(meshPeer)}, Timeout: 5 * time.Second}).DialContext},
	})
	t.Cleanup(mesh.Close)
	meshURL, err := url.Parse(mesh.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The ingress gateway: appends the client's address to
	// X-Forwarded-For.
	gw := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(meshURL)
			r.SetXForwarded()
		},
	})
	t.Cleanup(gw.Close)
	return chain{gateway: gw.URL, mesh: mesh.URL, appHits: &hits}
}

// codes sends n requests from the loopback address from through url and
// returns their status codes.
func codes(t *testing.T, url, from string, n int) []int {
	t.Helper()
	return send(t, url, from, "", n)
}

// forged is codes with an X-Forwarded-For of the client's choosing.
func forged(t *testing.T, url, from, xff string, n int) []int {
	t.Helper()
	return send(t, url, from, xff, n)
}

func send(t *testing.T, url, from, xff string, n int) []int {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}).DialContext}}
	defer client.CloseIdleConnections()
	var out []int
	for range n {
		req, err := http.NewRequest(http.MethodGet, url+"/api", nil)
		if err != nil {
			t.Fatal(err)
		}
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("request from %s: %v", from, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		out = append(out, res.StatusCode)
	}
	return out
}

func equal(got []int, want ...int) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// startSidecar runs a floodgate sidecar on the memory store in front of
// upstream and returns its proxy's URL.
func startSidecar(t *testing.T, policy, upstream string) *url.URL {
	t.Helper()
	u, err := url.Parse(simnode.RunInProcess(t, "--upstream", upstream, "--policy-file", policy, "--pod-name", "api-0",
		"--store", "memory", "--state-dir", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return u
}
