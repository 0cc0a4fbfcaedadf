package webhookcert

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

func TestWriteAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A regular file from an earlier writer is replaced by a link.
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := map[string][]byte{"tls.crt": []byte("cert-1"), "tls.key": []byte("key-1")}
	changed, err := writeAtomic(dir, first)
	if err != nil || !changed {
		t.Fatalf("writeAtomic = %v, %v; want a change", changed, err)
	}
	check := func(files map[string][]byte) {
		t.Helper()
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s = %q, %v; want %q", name, got, err, want)
			}
			if l, err := os.Readlink(filepath.Join(dir, name)); err != nil || l != filepath.Join("..data", name) {
				t.Errorf("%s is not a link through ..data: %q, %v", name, l, err)
			}
		}
	}
	check(first)
	if changed, err := writeAtomic(dir, first); err != nil || changed {
		t.Errorf("rewriting the same files = %v, %v; want no change", changed, err)
	}
	second := map[string][]byte{"tls.crt": []byte("cert-2"), "tls.key": []byte("key-2")}
	if changed, err := writeAtomic(dir, second); err != nil || !changed {
		t.Fatalf("writeAtomic = %v, %v; want a change", changed, err)
	}
	check(second)
	dirs, err := filepath.Glob(filepath.Join(dir, "..cert-*"))
	if err != nil || len(dirs) != 1 {
		t.Errorf("%d data directories left (%v), want 1", len(dirs), err)
	}
}

// TestCertwatcherReloadsWrittenCertificates checks, with
// controller-runtime's own certwatcher, that the webhook server serves a
// rewritten certificate without a restart.
func TestCertwatcherReloadsWrittenCertificates(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	dir := t.TempDir()
	write := func(b Bundle) {
		t.Helper()
		key, err := pki.KeyPEM(b.ServingKey)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := writeAtomic(dir, map[string][]byte{KeyTLSCert: pki.CertPEM(b.Serving), KeyTLSKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := settle(t, Bundle{}, time.Now(), p, false)
	write(b)
	cw, err := certwatcher.New(filepath.Join(dir, KeyTLSCert), filepath.Join(dir, KeyTLSKey))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cw.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("certwatcher: %v", err)
		}
	})

	served := func() []byte {
		c, err := cw.GetCertificate(nil)
		if err != nil || c == nil {
			return nil
		}
		return c.Certificate[0]
	}
	if !bytes.Equal(served(), b.Serving.Raw) {
		t.Fatal("certwatcher does not serve the first certificate")
	}
	// Several rewrites in a row, as a staged rotation makes.
	for i := range 3 {
		b, _ = settle(t, b, time.Now(), p, true)
		b, _ = settle(t, b, time.Now().Add(p.Propagation), p, false)
		write(b)
		deadline := time.Now().Add(20 * time.Second)
		for !bytes.Equal(served(), b.Serving.Raw) {
			if time.Now().After(deadline) {
				t.Fatalf("rewrite %d: certwatcher still serves the previous certificate", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
