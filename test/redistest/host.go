package redistest

// TB is the part of testing.TB that the helpers use. *testing.T and
// *testing.B have it, and so has ginkgo.GinkgoT().
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
	TempDir() string
}

// Host is a loopback IP of its own, from 127.1.0.0/16, claimed for one
// port: a stand-in for a Pod's IP. Start a server there with
// ServerOptions.Host.
type Host struct {
	// IP is the claimed address.
	IP   string
	lock *addrLock
}

// ClaimHost claims a loopback IP on which port and its cluster bus port
// (port+10000) are free, and releases it when tb ends.
func ClaimHost(tb TB, port int) *Host {
	tb.Helper()
	h, err := NewHost(port)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Release)
	return h
}

// NewHost claims a loopback IP like ClaimHost, outside any test; the
// caller calls Release.
func NewHost(port int) (*Host, error) {
	l, err := claimIP(port)
	if err != nil {
		return nil, err
	}
	return &Host{IP: l.host, lock: l}, nil
}

// Release gives the claim up. It is idempotent.
func (h *Host) Release() { h.lock.release() }
