package lean

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

const doc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: deny
    match: {path: {type: Prefix, value: /deny}}
    key: [{header: X-Key}]
    limit: {requests: 1, per: 1h}
`

// newProxy returns a proxy on doc with the memory store; logLevel is the
// deny-event log's level.
func newProxy(tb testing.TB, logLevel slog.Level) *proxy.Proxy {
	tb.Helper()
	c, err := config.Load([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := memstore.New()
	if err != nil {
		tb.Fatal(err)
	}
	e, err := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: logLevel}))
	ev := events.NewQueue(4096, log, nil, nil)
	p, err := proxy.New(proxy.Options{Upstream: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}, Engine: e, Metrics: m, Events: ev, Log: log})
	if err != nil {
		tb.Fatal(err)
	}
	p.SetRules(set)
	return p
}

// loopConn reads the same request forever and keeps the last write.
type loopConn struct {
	net.Conn
	req     []byte
	written bytes.Buffer
}

func (c *loopConn) Read(p []byte) (int, error) { return copy(p, c.req), nil }
func (c *loopConn) Write(p []byte) (int, error) {
	c.written.Reset()
	c.written.Write(p)
	return len(p), nil
}
func (c *loopConn) SetReadDeadline(time.Time) error  { return nil }
func (c *loopConn) SetWriteDeadline(time.Time) error { return nil }
func (c *loopConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *loopConn) String() string { return c.written.String() }
func (c *loopConn) first() string {
	s, _, _ := strings.Cut(c.written.String(), "\r\n")
	return s
}

// A denied request costs no allocation: head parsed in place, the
// decision from the deny cache, the answer from the prebuilt response,
// the deny event summed (info) or counted (warn).
func TestDenyPathAllocatesNothing(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
		p := newProxy(t, level)
		s := New(Options{Upstream: "127.0.0.1:1", Proxy: func() *proxy.Proxy { return p }})
		lc := &loopConn{req: []byte("GET /deny/x HTTP/1.1\r\nHost: x\r\nX-Key: abuser\r\nUser-Agent: t\r\n\r\n")}
		c := newConn(s, lc)
		one := func() {
			n, ok := c.readHead()
			if !ok || !c.serveOne(n) {
				t.Fatal("the connection closed")
			}
		}
		// The first request is admitted (and fails upstream: nothing
		// listens), then the key is denied locally; use up the deny-event
		// line budget.
		c.serveOne(mustHead(t, c))
		for range events.LinesPerSecond + 10 {
			one()
		}
		if got := lc.first(); got != "HTTP/1.1 429 Too Many Requests" {
			t.Fatalf("answer %q", lc.String())
		}
		if n := testing.AllocsPerRun(1000, one); n != 0 {
			t.Errorf("log level %v: %v allocations per denied request, want 0", level, n)
		}
	}
}

func mustHead(t *testing.T, c *conn) int {
	t.Helper()
	n, ok := c.readHead()
	if !ok {
		t.Fatal("no head")
	}
	return n
}

// BenchmarkDenyPath is a denied request through the lean core without the
// network: parse, decide from the deny cache, answer.
func BenchmarkDenyPath(b *testing.B) {
	p := newProxy(b, slog.LevelWarn)
	s := New(Options{Upstream: "127.0.0.1:1", Proxy: func() *proxy.Proxy { return p }})
	lc := &loopConn{req: []byte("GET /deny/x HTTP/1.1\r\nHost: x\r\nX-Key: abuser\r\nUser-Agent: t\r\n\r\n")}
	c := newConn(s, lc)
	c.serveOne(mustHeadB(b, c))
	b.ReportAllocs()
	for b.Loop() {
		n, _ := c.readHead()
		c.serveOne(n)
	}
}

func mustHeadB(b *testing.B, c *conn) int {
	n, ok := c.readHead()
	if !ok {
		b.Fatal("no head")
	}
	return n
}
