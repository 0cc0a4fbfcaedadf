package webhookcert

import (
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testPolicy() Policy {
	return Policy{CALifetime: 30 * time.Hour, ServingLifetime: 3 * time.Hour, Propagation: 10 * time.Minute,
		Hosts: []string{"floodgate-webhook.floodgate-system.svc", "127.0.0.1"}}
}

// settle plans and applies at now until nothing changes, as Sync does,
// and returns the decisions taken.
func settle(t *testing.T, b Bundle, now time.Time, p Policy, rotate bool) (Bundle, []Decision) {
	t.Helper()
	var ds []Decision
	for range 4 {
		d := Plan(b, now, p, rotate)
		if !d.Changes() {
			return b, ds
		}
		ds = append(ds, d)
		if d.NewCA && d.Staged {
			rotate = false
		}
		var err error
		if b, err = apply(b, d, now, p); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("Plan did not settle at %v: %+v", now, ds)
	return b, ds
}

func TestPlanStagesARotation(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	// The CA comes due while the first renewed serving certificate is
	// fresh.
	p.CALifetime = 7 * time.Hour

	b, ds := settle(t, Bundle{}, t0, p, false)
	if len(ds) != 1 || !ds[0].NewCA || ds[0].Staged || !ds[0].NewServing {
		t.Fatalf("first sync: %+v, want one immediate new CA and serving certificate", ds)
	}
	if err := verify(b.Serving, b.Trusted, t0, "127.0.0.1"); err != nil {
		t.Fatalf("the first serving certificate does not verify: %v", err)
	}
	if got, want := Next(b, p), pki.RenewAt(b.Serving); !got.Equal(want) {
		t.Errorf("Next = %v, want the serving renewal %v", got, want)
	}
	firstCA := b.CA

	step := func(name string, at time.Time, rotate bool, want Decision) Bundle {
		t.Helper()
		nb, ds := settle(t, b, at, p, rotate)
		got := Decision{}
		if len(ds) > 0 {
			got = ds[0]
		}
		got.Reason = ""
		if len(ds) > 1 || got != want {
			t.Fatalf("%s: decisions %+v, want just %+v", name, ds, want)
		}
		return nb
	}

	b = step("before renewal", pki.RenewAt(b.Serving).Add(-time.Second), false, Decision{})
	b = step("serving renewal", pki.RenewAt(b.Serving), false, Decision{NewServing: true})
	if b.CA != firstCA || len(b.Trusted) != 1 {
		t.Fatal("renewing the serving certificate touched the CA")
	}

	rolled := pki.RenewAt(b.CA)
	b = step("CA renewal", rolled, false, Decision{NewCA: true, Staged: true})
	if len(b.Trusted) != 2 || b.Trusted[1] != firstCA || b.Serving.CheckSignatureFrom(firstCA) != nil {
		t.Fatal("a staged CA must join the bundle ahead of the old one and sign nothing yet")
	}
	if got, want := Next(b, p), rolled.Add(p.Propagation); !got.Equal(want) {
		t.Errorf("Next = %v, want the end of propagation %v", got, want)
	}
	b = step("during propagation", rolled.Add(p.Propagation-time.Second), false, Decision{})
	b = step("after propagation", rolled.Add(p.Propagation), false, Decision{NewServing: true})
	if b.Serving.CheckSignatureFrom(b.CA) != nil || len(b.Trusted) != 2 {
		t.Fatal("the reissued serving certificate must come from the new CA while the old CA stays trusted")
	}
	b = step("old CA kept", rolled.Add(2*p.Propagation-time.Second), false, Decision{})
	b = step("old CA dropped", rolled.Add(2*p.Propagation), false, Decision{DropOld: true})
	if len(b.Trusted) != 1 || b.Trusted[0] != b.CA {
		t.Fatalf("bundle has %d CAs, want only the current one", len(b.Trusted))
	}

	at := rolled.Add(3 * p.Propagation)
	b = step("requested rotation", at, true, Decision{NewCA: true, Staged: true})
	_ = step("a second request waits for the first", at.Add(time.Second), true, Decision{})
}

func TestPlanReplacesWhatIsUnusable(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	b, _ := settle(t, Bundle{}, t0, p, false)

	other := p
	other.Hosts = []string{"renamed.floodgate-system.svc"}
	if d := Plan(b, t0.Add(time.Minute), other, false); !d.NewServing || d.NewCA {
		t.Errorf("new hosts: %+v, want an immediate new serving certificate", d)
	}
	if d := Plan(b, b.Serving.NotAfter, p, false); !d.NewServing {
		t.Errorf("expired serving certificate: %+v, want a new one", d)
	}
	if d := Plan(b, b.CA.NotAfter, p, false); !d.NewCA || d.Staged {
		t.Errorf("expired CA: %+v, want an immediate new CA", d)
	}

	// A serving certificate that no trusted CA signed is replaced at once,
	// rather than waiting for a propagation that will never help.
	stranger, _ := settle(t, Bundle{}, t0, p, false)
	mixed := b
	mixed.Serving, mixed.ServingKey = stranger.Serving, stranger.ServingKey
	if d := Plan(mixed, t0.Add(time.Minute), p, false); !d.NewServing {
		t.Errorf("serving certificate of an unknown CA: %+v, want a new one", d)
	}

	// The Secret's contents round-trip, and a mismatched key is dropped.
	data, err := encode(b)
	if err != nil {
		t.Fatal(err)
	}
	back := decode(data, b.CARolledAt, b.ServingIssuedAt)
	if !back.CA.Equal(b.CA) || !back.Serving.Equal(b.Serving) || len(back.Trusted) != 1 {
		t.Fatal("encode/decode lost the bundle")
	}
	if d := Plan(back, t0.Add(time.Minute), p, false); d.Changes() {
		t.Errorf("a decoded bundle needs %+v, want nothing", d)
	}
	strangerData, err := encode(stranger)
	if err != nil {
		t.Fatal(err)
	}
	data[KeyTLSKey] = strangerData[KeyTLSKey]
	data[KeyCAKey] = strangerData[KeyCAKey]
	if got := decode(data, t0, t0); got.Serving != nil || got.CA != nil {
		t.Error("decode kept a certificate whose key does not match")
	}
	if got := decode(map[string][]byte{KeyCACert: []byte("garbage"), KeyTLSCert: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")}, t0, t0); got.CA != nil || got.Serving != nil || len(got.Trusted) != 0 {
		t.Error("decode made something of garbage")
	}
}

// TestRotationNeverBreaksTrust simulates years of syncs with short
// lifetimes and a rotation request, and checks the invariant that matters:
// an API server whose caBundle lags the Secret, talking to a replica whose
// certificate lags the Secret, both by less than the propagation period,
// always verifies the certificate.
func TestRotationNeverBreaksTrust(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	const sync = time.Minute
	type snapshot struct {
		at      time.Time
		trusted []*x509.Certificate
		serving *x509.Certificate
	}
	var history []snapshot
	var b Bundle
	end := t0.Add(3 * p.CALifetime)
	rotations := 0
	for now := t0; now.Before(end); now = now.Add(sync) {
		rotate := now.Equal(t0.Add(7 * time.Hour))
		var ds []Decision
		b, ds = settle(t, b, now, p, rotate)
		for _, d := range ds {
			if d.NewCA && d.Staged {
				rotations++
			}
		}
		if n := Next(b, p); !n.After(now) {
			t.Fatalf("at %v: Next = %v is not in the future; the sync loop would spin", now.Sub(t0), n.Sub(t0))
		}
		if len(ds) > 0 || len(history) == 0 {
			history = append(history, snapshot{now, slices.Clone(b.Trusted), b.Serving})
		}
	}
	if rotations < 3 {
		t.Fatalf("only %d staged CA rotations in the simulation, want at least 3 (scheduled and requested)", rotations)
	}
	at := func(t time.Time) snapshot {
		i, _ := slices.BinarySearchFunc(history, t, func(s snapshot, t time.Time) int {
			if s.at.After(t) {
				return 1
			}
			return -1
		})
		return history[max(i-1, 0)]
	}
	lags := []time.Duration{0, p.Propagation / 3, 2 * p.Propagation / 3, p.Propagation - sync}
	// The instants that matter are just after each change, within the
	// lags; a sparse grid covers the rest.
	var instants []time.Time
	for _, h := range history {
		for _, l := range lags {
			instants = append(instants, h.at.Add(l), h.at.Add(l+sync), h.at.Add(p.Propagation+l))
		}
	}
	for now := t0; now.Before(end); now = now.Add(time.Hour) {
		instants = append(instants, now)
	}
	checked := 0
	for _, now := range instants {
		if now.Before(t0.Add(p.Propagation)) || !now.Before(end) {
			continue
		}
		for _, apiLag := range lags {
			for _, replicaLag := range lags {
				bundle := at(now.Add(-apiLag)).trusted
				served := at(now.Add(-replicaLag)).serving
				if err := verify(served, bundle, now, "127.0.0.1"); err != nil {
					t.Fatalf("at %v (API server %v behind, replica %v behind): %v", now.Sub(t0), apiLag, replicaLag, err)
				}
				checked++
			}
		}
	}
	t.Logf("%d rotations, %d changes, %d checks", rotations, len(history), checked)
}

func verify(c *x509.Certificate, trusted []*x509.Certificate, now time.Time, host string) error {
	roots := x509.NewCertPool()
	for _, ca := range trusted {
		roots.AddCert(ca)
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}
