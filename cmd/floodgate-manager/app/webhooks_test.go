package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	certutil "k8s.io/client-go/util/cert"
)

// TestWebhookReplicaStopsWithoutFailingARequest stops one of two webhook
// replicas while a client built as the API server builds its webhook
// client keeps sending admission-sized POSTs through a connection-level
// load balancer (what kube-proxy is to the webhook Service). Every request
// must be answered: a request the stopping replica did not take goes to
// the other one. Over HTTP/1.1 keep-alive, closing the idle connection
// races the client's next request on it, which fails with a broken pipe or
// EOF; the webhook server offers HTTP/2, whose GOAWAY makes the client
// retry on a new connection.
func TestWebhookReplicaStopsWithoutFailingARequest(t *testing.T) {
	certDir := t.TempDir()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("floodgate-webhook.test.svc", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// Two replicas, each counting what it answered.
	type replica struct {
		addr   string
		served atomic.Int64
		cancel context.CancelFunc
		done   chan error
	}
	start := func() *replica {
		r := &replica{addr: freeAddr(t), done: make(chan error, 1)}
		_, port, _ := net.SplitHostPort(r.addr)
		o := DefaultOptions()
		o.Webhook.Port, _ = strconv.Atoi(port)
		o.Webhook.CertDir = certDir
		srv := webhookServer(&o)
		srv.Register("/probe", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, err := io.ReadAll(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.served.Add(1)
			_, _ = w.Write(body)
		}))
		var ctx context.Context
		ctx, r.cancel = context.WithCancel(context.Background())
		go func() { r.done <- srv.Start(ctx) }()
		t.Cleanup(func() {
			r.cancel()
			if err := <-r.done; err != nil {
				t.Errorf("webhook replica %s stopped with %v", r.addr, err)
			}
		})
		return r
	}
	a, b := start(), start()

	// The load balancer picks a replica per connection, as kube-proxy
	// does; a replica leaves it before it stops, as a terminating pod
	// leaves the Service's endpoints before its preStop delay ends.
	var aRemoved atomic.Bool
	lb, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lb.Close() })
	go func() {
		for {
			c, err := lb.Accept()
			if err != nil {
				return
			}
			to := a.addr
			if aRemoved.Load() {
				to = b.addr
			}
			go splice(c, to)
		}
	}()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Timeout: 10 * time.Second, Transport: utilnet.SetTransportDefaults(&http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "floodgate-webhook.test.svc"},
	})}
	url := "https://" + lb.Addr().String() + "/probe"

	// Both replicas must be up before the clock starts.
	for _, r := range []*replica{a, b} {
		deadline := time.Now().Add(time.Minute)
		for {
			c, err := tls.Dial("tcp", r.addr, &tls.Config{RootCAs: pool, ServerName: "floodgate-webhook.test.svc", NextProtos: []string{"h2", "http/1.1"}})
			if err == nil {
				proto := c.ConnectionState().NegotiatedProtocol
				_ = c.Close()
				if proto != "h2" {
					t.Fatalf("the webhook server negotiated %q, want h2", proto)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("webhook replica %s never served: %v", r.addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		sent     atomic.Int64
		mu       sync.Mutex
		failures []error
	)
	body := bytes.Repeat([]byte("x"), 4096) // about an AdmissionReview of a pod
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err == nil {
					got, rerr := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					switch {
					case rerr != nil:
						err = rerr
					case resp.StatusCode != http.StatusOK || !bytes.Equal(got, body):
						err = errors.New("answered " + resp.Status)
					}
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: not within a minute (a served %d, b served %d)", what, a.served.Load(), b.served.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("replica a answers", func() bool { return a.served.Load() >= 200 })
	aRemoved.Store(true)
	a.cancel()
	if err := <-a.done; err != nil {
		t.Errorf("replica a stopped with %v", err)
	}
	a.done <- nil // for the cleanup
	servedByB := b.served.Load()
	waitFor("replica b answers after a stopped", func() bool { return b.served.Load() >= servedByB+200 })
	close(stop)
	wg.Wait()

	t.Logf("%d requests: replica a answered %d, replica b %d", sent.Load(), a.served.Load(), b.served.Load())
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed while a replica stopped; first: %v", len(failures), sent.Load(), failures[0])
	}
}

// splice relays c to a new connection to addr until either side closes.
func splice(c net.Conn, addr string) {
	defer func() { _ = c.Close() }()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
