package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestStoreCAFileFollowed: the compiled config names the CA bundle's file
// (config.StoreCAFile in a pod), which the kubelet may write after the
// config arrives. The store is opened without it, refuses a server the
// file does not vouch for, and verifies with the file as it is at each new
// connection: no restart once the right bundle lands.
func TestStoreCAFileFollowed(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLSServer(t)
	_, _, otherCA := redistest.NewCA(t)
	file := filepath.Join(t.TempDir(), config.StoreCAKey)

	tc, roots := tlsConfig(&config.TLS{CAFile: file})
	if tc == nil || roots == nil {
		t.Fatal("tlsConfig with a CA file: no TLS or no roots function")
	}
	if _, err := roots(); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("roots with no file: %v, want an error naming %s", err, file)
	}
	s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.TLSAddr}, Single: true, Timeout: time.Second,
		BreakerCooldown: 50 * time.Millisecond, TLS: tc, TLSRoots: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Minute}
	take := func() error {
		_, _, err := s.Take(t.Context(), limiter.Request{Key: "ca-file", Limit: l, Cost: 1})
		return err
	}
	if err := take(); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take before the CA file exists: %v, want ErrUnavailable", err)
	}
	for _, bad := range [][]byte{[]byte("not a certificate\n"), otherCA} {
		if err := os.WriteFile(file, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		// Three failed takes stay under the shard breaker's threshold of
		// five, and a failed TLS dial keeps no connection: the next take
		// dials again and reads the file as it is now.
		if err := take(); !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("take with a CA file of %d bytes that does not vouch for the server: %v, want ErrUnavailable", len(bad), err)
		}
	}
	if err := os.WriteFile(file, srv.CA, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for err := take(); err != nil; err = take() {
		if time.Now().After(deadline) {
			t.Fatalf("take still fails 5 s after the right CA file was written: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTLSConfigWithoutCAFile: no CA file means the system roots, read once
// by crypto/tls, and no roots function.
func TestTLSConfigWithoutCAFile(t *testing.T) {
	t.Parallel()
	if tc, roots := tlsConfig(nil); tc != nil || roots != nil {
		t.Errorf("tlsConfig(nil) = %v, %v; want no TLS", tc, roots != nil)
	}
	tc, roots := tlsConfig(&config.TLS{ServerName: "redis.data.svc"})
	if tc == nil || tc.ServerName != "redis.data.svc" || tc.RootCAs != nil || tc.InsecureSkipVerify {
		t.Errorf("tlsConfig = %+v, want the server name, system roots, verification on", tc)
	}
	if roots != nil {
		t.Error("a roots function without a CA file")
	}
}
