package rlsidentity

import (
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testPolicy() Policy {
	return Policy{CALifetime: 30 * time.Hour, LeafLifetime: 3 * time.Hour, Propagation: 10 * time.Minute}
}

const (
	serving = "serving"
	g1      = "client:infra/g1"
	g2      = "client:bank/g2"
)

func testWant(ids ...string) map[string]pki.Leaf {
	all := map[string]pki.Leaf{
		serving: ServingLeaf("floodgate-ratelimit", "floodgate-system", ""),
		g1:      ClientLeaf("infra", "g1"),
		g2:      ClientLeaf("bank", "g2"),
	}
	out := map[string]pki.Leaf{}
	for _, id := range ids {
		out[id] = all[id]
	}
	return out
}

// settle plans and applies at now until nothing changes, as Sync does,
// and returns the decisions taken.
func settle(t *testing.T, s State, want map[string]pki.Leaf, now time.Time, p Policy, rotate bool) (State, []Decision) {
	t.Helper()
	var ds []Decision
	for range 4 {
		d := Plan(s, want, now, p, rotate)
		if !d.Changes() {
			return s, ds
		}
		ds = append(ds, d)
		if d.NewCA && d.Staged {
			rotate = false
		}
		var err error
		if s, err = apply(s, d, want, now, p); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("Plan did not settle at %v: %+v", now, ds)
	return s, ds
}

func TestPlanStagesARotation(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	// The CA comes due while the first renewed leaves are fresh.
	p.CALifetime = 7 * time.Hour
	want := testWant(serving, g1, g2)

	s, ds := settle(t, State{}, want, t0, p, false)
	if len(ds) != 1 || !ds[0].NewCA || ds[0].Staged || !slices.Equal(ds[0].Issue, []string{g2, g1, serving}) {
		t.Fatalf("first sync: %+v, want one immediate new CA and every leaf", ds)
	}
	firstCA := s.CA
	step := func(name string, at time.Time, rotate bool, want Decision) State {
		t.Helper()
		ns, ds := settle(t, s, testWant(serving, g1, g2), at, p, rotate)
		got := Decision{}
		if len(ds) > 0 {
			got = ds[0]
		}
		got.Reason = ""
		if len(ds) > 1 || got.NewCA != want.NewCA || got.Staged != want.Staged || got.DropOld != want.DropOld || !slices.Equal(got.Issue, want.Issue) {
			t.Fatalf("%s: decisions %+v, want just %+v", name, ds, want)
		}
		return ns
	}
	renew := pki.RenewAt(s.Leaves[serving].Cert)
	if got := Next(s, want, p); !got.Equal(renew) {
		t.Errorf("Next = %v, want the leaves' renewal %v", got, renew)
	}
	s = step("before renewal", renew.Add(-time.Second), false, Decision{})
	s = step("leaf renewal", renew, false, Decision{Issue: []string{g2, g1, serving}})
	if s.CA != firstCA || len(s.Trusted) != 1 {
		t.Fatal("renewing the leaves touched the CA")
	}

	rolled := pki.RenewAt(s.CA)
	s = step("CA renewal", rolled, false, Decision{NewCA: true, Staged: true})
	if len(s.Trusted) != 2 || s.Trusted[1] != firstCA || s.Leaves[g1].Cert.CheckSignatureFrom(firstCA) != nil {
		t.Fatal("a staged CA must join the bundle ahead of the old one and sign nothing yet")
	}
	if got, want := Next(s, want, p), rolled.Add(p.Propagation); !got.Equal(want) {
		t.Errorf("Next = %v, want the end of propagation %v", got, want)
	}
	s = step("during propagation", rolled.Add(p.Propagation-time.Second), false, Decision{})
	s = step("after propagation", rolled.Add(p.Propagation), false, Decision{Issue: []string{g2, g1, serving}})
	for id, l := range s.Leaves {
		if l.Cert.CheckSignatureFrom(s.CA) != nil {
			t.Fatalf("%s was not reissued by the new CA", id)
		}
	}
	if len(s.Trusted) != 2 {
		t.Fatal("the old CA must stay trusted while its certificates may be in use")
	}
	s = step("old CA kept", rolled.Add(2*p.Propagation-time.Second), false, Decision{})
	s = step("old CA dropped", rolled.Add(2*p.Propagation), false, Decision{DropOld: true})
	if len(s.Trusted) != 1 || s.Trusted[0] != s.CA {
		t.Fatalf("bundle has %d CAs, want only the current one", len(s.Trusted))
	}
	at := rolled.Add(3 * p.Propagation)
	s = step("requested rotation", at, true, Decision{NewCA: true, Staged: true})
	_ = step("a second request waits for the first", at.Add(time.Second), true, Decision{})
}

func TestPlanReplacesWhatIsUnusable(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	s, _ := settle(t, State{}, testWant(serving, g1), t0, p, false)

	// A gateway added to the list gets its certificate at once, from the
	// current CA; the others are left alone.
	if d := Plan(s, testWant(serving, g1, g2), t0.Add(time.Minute), p, false); d.NewCA || !slices.Equal(d.Issue, []string{g2}) {
		t.Errorf("a new gateway: %+v, want only its certificate issued", d)
	}
	// A gateway removed from the list needs nothing.
	if d := Plan(s, testWant(serving), t0.Add(time.Minute), p, false); d.Changes() {
		t.Errorf("a removed gateway: %+v, want nothing", d)
	}
	// A certificate that names something else (a service renamed).
	renamed := testWant(serving, g1)
	renamed[serving] = ServingLeaf("other", "floodgate-system", "")
	if d := Plan(s, renamed, t0.Add(time.Minute), p, false); !slices.Equal(d.Issue, []string{serving}) {
		t.Errorf("a renamed service: %+v, want its certificate reissued", d)
	}
	if d := Plan(s, testWant(serving, g1), s.Leaves[g1].Cert.NotAfter, p, false); !slices.Contains(d.Issue, g1) {
		t.Errorf("an expired certificate: %+v, want a new one", d)
	}
	if d := Plan(s, testWant(serving, g1), s.CA.NotAfter, p, false); !d.NewCA || d.Staged {
		t.Errorf("an expired CA: %+v, want an immediate new CA", d)
	}
	// A certificate no trusted CA signed is replaced at once, rather than
	// waiting for a propagation that will never help.
	stranger, _ := settle(t, State{}, testWant(serving, g1), t0, p, false)
	mixed := s
	mixed.Leaves = map[string]Leaf{serving: s.Leaves[serving], g1: stranger.Leaves[g1]}
	if d := Plan(mixed, testWant(serving, g1), t0.Add(time.Minute), p, false); !slices.Equal(d.Issue, []string{g1}) {
		t.Errorf("a certificate of an unknown CA: %+v, want a new one", d)
	}
}

// TestRotationNeverBreaksTrust simulates days of syncs with short
// lifetimes, a rotation request, and a gateway added on the way, and
// checks the invariant that matters, both ways: the central service's
// certificate verifies against every gateway's bundle, and every
// gateway's certificate against the service's bundle, when each party's
// files lag the Secrets by any amount less than the propagation period.
func TestRotationNeverBreaksTrust(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	const sync = time.Minute
	type snapshot struct {
		at      time.Time
		trusted []*x509.Certificate
		leaves  map[string]*x509.Certificate
	}
	var history []snapshot
	var s State
	end := t0.Add(3 * p.CALifetime)
	added := t0.Add(2 * time.Hour)
	rotations := 0
	for now := t0; now.Before(end); now = now.Add(sync) {
		want := testWant(serving, g1)
		if !now.Before(added) {
			want = testWant(serving, g1, g2)
		}
		var ds []Decision
		s, ds = settle(t, s, want, now, p, now.Equal(t0.Add(7*time.Hour)))
		for _, d := range ds {
			if d.NewCA && d.Staged {
				rotations++
			}
		}
		if n := Next(s, want, p); !n.After(now) {
			t.Fatalf("at %v: Next = %v is not in the future; the sync loop would spin", now.Sub(t0), n.Sub(t0))
		}
		if len(ds) > 0 || len(history) == 0 {
			leaves := map[string]*x509.Certificate{}
			for id, l := range s.Leaves {
				leaves[id] = l.Cert
			}
			history = append(history, snapshot{now, slices.Clone(s.Trusted), leaves})
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
		for _, bundleLag := range lags {
			for _, certLag := range lags {
				bundle := at(now.Add(-bundleLag)).trusted
				leaves := at(now.Add(-certLag)).leaves
				if err := verify(leaves[serving], bundle, now, x509.ExtKeyUsageServerAuth); err != nil {
					t.Fatalf("at %v (gateway's bundle %v behind, service's certificate %v behind): %v", now.Sub(t0), bundleLag, certLag, err)
				}
				for _, g := range []string{g1, g2} {
					if leaves[g] == nil || now.Add(-certLag).Before(added.Add(p.Propagation)) && g == g2 {
						// A gateway is usable once its Secret reached it.
						continue
					}
					if err := verify(leaves[g], bundle, now, x509.ExtKeyUsageClientAuth); err != nil {
						t.Fatalf("at %v (service's bundle %v behind, %s's certificate %v behind): %v", now.Sub(t0), bundleLag, g, certLag, err)
					}
				}
				checked++
			}
		}
	}
	t.Logf("%d rotations, %d changes, %d checks", rotations, len(history), checked)
}

func verify(c *x509.Certificate, trusted []*x509.Certificate, now time.Time, usage x509.ExtKeyUsage) error {
	roots := x509.NewCertPool()
	for _, ca := range trusted {
		roots.AddCert(ca)
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}
