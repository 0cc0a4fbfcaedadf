package runner

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The grammar of the differential harness's generated requests: an
// HTTP/1.1 request built from the routes the upstreams serve, with the
// mutations that smuggling and bypass vectors are made of. Every choice
// comes from a chooser, so a seed, or the fuzzer's bytes, replays a
// request exactly.

// chooser picks a number in [0, n).
type chooser interface{ IntN(n int) int }

// byteChooser chooses from the fuzzer's bytes, then 0 when they run out.
type byteChooser struct{ b []byte }

func (c *byteChooser) IntN(n int) int {
	if len(c.b) == 0 || n <= 1 {
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v % n
}

type gen struct{ c chooser }

func newGen(c chooser) *gen { return &gen{c: c} }

func (g *gen) pick(options ...string) string { return options[g.c.IntN(len(options))] }

// one returns true one time in n.
func (g *gen) one(n int) bool { return g.c.IntN(n) == 0 }

// eol is the line ending: CRLF, now and then a bare LF.
func (g *gen) eol() string {
	if g.one(25) {
		return "\n"
	}
	return "\r\n"
}

func (g *gen) method() string {
	if g.one(12) {
		return g.pick("get", "Post", "GET ", "G ET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "TRACE", "CONNECT", "GET\t", "POST\x00", "\x7fGET")
	}
	return g.pick("GET", "GET", "POST", "POST", "HEAD", "PUT")
}

// path is a route of the upstreams, mutated.
func (g *gen) path() string {
	p := g.pick("/once", "/login", "/admin", "/keyed", "/deep/x", "/deep/", "/other", "/")
	for range g.c.IntN(3) {
		p = g.mutatePath(p)
	}
	return p
}

func (g *gen) mutatePath(p string) string {
	switch g.c.IntN(14) {
	case 0: // a dot segment or a doubled slash in front
		return g.pick("/.", "/x/..", "/", "/%2e", "/%2E%2E/x", "/./.", "/x/%2e%2e") + p
	case 1: // one character percent-encoded
		if len(p) < 2 {
			return p
		}
		i := 1 + g.c.IntN(len(p)-1)
		hex := strconv.FormatUint(uint64(p[i]), 16)
		if g.one(2) {
			hex = strings.ToUpper(hex)
		}
		enc := "%" + hex
		if g.one(6) {
			enc = "%25" + hex // encoded twice
		}
		return p[:i] + enc + p[i+1:]
	case 2: // something after the path
		return p + g.pick("/", "//", "/.", "/..", ";x", ";", "%20", " ", "%09", "%00", "%5C", "\\", "#frag", "?q=1", "?", "%3F", "%23x", "/%2e", ".", "%2F", "%2f..", "*", "~")
	case 3: // case
		return g.pick(strings.ToUpper(p), strings.ToLower(p), strings.ToUpper(p[:min(2, len(p))])+p[min(2, len(p)):])
	case 4: // absolute form
		return g.pick("http://x", "HTTP://x", "http://x:80", "https://x", "http://x@y", "//x") + p
	case 5: // a separator that is not a slash
		if i := strings.LastIndexByte(p, '/'); i >= 0 {
			return p[:i] + g.pick("\\", "%2F", "%5c", "//", "/./") + p[i+1:]
		}
		return p
	case 6: // bytes that are not ASCII
		return p + g.pick("\xc0\xaf", "\xef\xbc\x8f", "\xff", "%c0%af", "%e2%80%8b")
	case 7: // a parameter in a segment
		if i := strings.IndexByte(p[1:], '/'); i >= 0 {
			return p[:i+1] + ";a=b" + p[i+1:]
		}
		return p + ";a=b/"
	case 8:
		return "*"
	default:
		return p
	}
}

func (g *gen) version() string {
	if g.one(15) {
		return g.pick("HTTP/1.0", "HTTP/1.2", "http/1.1", "HTTP/1.1 ", "HTTP/2.0", "HTTP/1", "HTTP/01.1", "HTTP/1.10", "")
	}
	return "HTTP/1.1"
}

// header is a field, now and then malformed.
func (g *gen) header(name, value string) string {
	switch g.c.IntN(30) {
	case 0:
		return name + " : " + value
	case 1:
		return name + ":" + value
	case 2:
		return name + ":\t" + value + "\t"
	case 3:
		return strings.ToLower(name) + ": " + value
	case 4:
		return strings.ReplaceAll(name, "-", "_") + ": " + value
	case 5:
		return name + ": " + value + g.eol() + " folded"
	default:
		return name + ": " + value
	}
}

// request is one generated request, with now and then a second one after
// it on the connection.
func (g *gen) request() []byte {
	r := g.single(true)
	if g.one(8) {
		r += g.single(false)
	}
	return []byte(r)
}

func (g *gen) single(outer bool) string {
	var b strings.Builder
	m := g.method()
	b.WriteString(m + " " + g.path() + " " + g.version())
	eol := g.eol()
	b.WriteString(eol)
	var lines []string
	switch g.c.IntN(12) {
	case 0: // no Host
	case 1:
		lines = append(lines, "Host: x", "Host: y")
	case 2:
		lines = append(lines, g.header("Host", g.pick("", "x:80", "x y", "admin")))
	default:
		lines = append(lines, "Host: x")
	}
	switch g.c.IntN(6) {
	case 0: // no key
	case 1:
		v := g.pick("alice", "bob")
		lines = append(lines, g.header("X-Api-Key", v), g.header("X-Api-Key", g.pick("alice", "junk", "")))
	default:
		lines = append(lines, g.header("X-Api-Key", g.pick("alice", "bob", "", " alice", "alice ", "ALICE", "a,b", "alice\x00", "al\tice")))
	}
	if g.one(6) {
		lines = append(lines, g.header("Connection", g.pick("close", "keep-alive", "Content-Length", "Transfer-Encoding",
			"Host", "X-Api-Key", "upgrade", "keep-alive, X-Api-Key", "TE", "close, Content-Length")))
	}
	if g.one(12) {
		lines = append(lines, g.header("Upgrade", g.pick("h2c", "websocket", "HTTP/2.0", "foo")))
		if g.one(2) {
			lines = append(lines, "Connection: Upgrade")
		}
	}
	if g.one(20) {
		lines = append(lines, g.header("Expect", g.pick("100-continue", "100-Continue", "bogus")))
	}
	body := ""
	switch g.c.IntN(6) {
	case 0, 1: // no body
	case 2, 3:
		body = strings.Repeat("b", g.c.IntN(20))
		lines = append(lines, g.header("Content-Length", g.contentLength(len(body))))
		if g.one(8) {
			lines = append(lines, g.header("Content-Length", g.contentLength(len(body)+g.c.IntN(3))))
		}
	case 4:
		body = g.chunked()
		lines = append(lines, g.header("Transfer-Encoding", g.pick("chunked", "chunked", "Chunked", " chunked", "chunked, identity",
			"identity, chunked", "gzip, chunked", "chunked\x0b", "xchunked", "chunk")))
		if g.one(3) {
			lines = append(lines, "Content-Length: "+strconv.Itoa(g.c.IntN(8)))
		}
	case 5:
		// A body that is a request: the smuggling carrier.
		inner := "GET /once HTTP/1.1\r\nHost: x\r\n\r\n"
		if !outer {
			inner = ""
		}
		body = inner
		lines = append(lines, g.header("Content-Length", strconv.Itoa(len(inner)-g.c.IntN(2)*len(inner))))
		if g.one(2) {
			lines = append(lines, "Transfer-Encoding: chunked")
		}
	}
	g.shuffle(lines)
	for _, l := range lines {
		b.WriteString(l + g.eol())
	}
	b.WriteString(g.eol())
	b.WriteString(body)
	return b.String()
}

func (g *gen) contentLength(n int) string {
	s := strconv.Itoa(n)
	if g.one(8) {
		return g.pick("+"+s, "0"+s, s+" ", " "+s, s+","+s, "0x"+strconv.FormatInt(int64(n), 16), s+".0", "-"+s)
	}
	return s
}

func (g *gen) chunked() string {
	var b strings.Builder
	for range g.c.IntN(3) {
		n := 1 + g.c.IntN(6)
		size := strconv.FormatInt(int64(n), 16)
		if g.one(6) {
			size = g.pick(size+";ext=1", "0"+size, size+" ", strings.ToUpper(size)+"\t", "0x"+size, size+"\n")
		}
		b.WriteString(size + g.eol() + strings.Repeat("c", n) + g.eol())
	}
	if !g.one(30) { // now and then no last chunk: the body stalls
		b.WriteString(g.pick("0", "0", "00", "0;x") + g.eol())
		if g.one(6) {
			b.WriteString("X-Trailer: t" + g.eol())
		}
		b.WriteString(g.eol())
	}
	return b.String()
}

func (g *gen) shuffle(lines []string) {
	for i := len(lines) - 1; i > 0; i-- {
		j := g.c.IntN(i + 1)
		lines[i], lines[j] = lines[j], lines[i]
	}
}

// FuzzDifferential sends the fuzzer's requests, built from its bytes by
// the harness's grammar, through the sidecar to the upstreams:
//
//	go test ./sidecar/runner -run '^$' -fuzz FuzzDifferential -fuzztime 10m
//
// Each fuzzing process starts every upstream, one for each front. An
// input's first byte picks the upstream and front, the rest builds the
// request, so that one input takes one exchange and stays within the
// engine's patience (it kills a process whose input runs past a few
// seconds). A longer run of the seeded generator is the other way to go
// further: go test ./sidecar/runner -run '^TestDifferential$' -args
// -differential.cases 4000 -differential.seed N.
func FuzzDifferential(f *testing.F) {
	for _, seed := range []string{"", "\x00\x01\x02", "\x05\x04\x03\x02\x01\x00\x07", "\xff\xfe\xfd\xfc\xfb\xfa", "\x03\x02\x00\x05\x01"} {
		f.Add([]byte(seed))
	}
	var runs []*diffRun
	for _, u := range diffUpstreams {
		for _, fr := range diffFronts {
			run := startDiffRun(f, u.start(f), fr.args)
			run.answerWait, run.parseWait = 2*time.Second, time.Second
			runs = append(runs, run)
		}
	}
	f.Fuzz(func(t *testing.T, choices []byte) {
		run := runs[0]
		if len(choices) > 0 {
			run, choices = runs[int(choices[0])%len(runs)], choices[1:]
		}
		run.one(t, "fuzzed case", newGen(&byteChooser{b: choices}).request())
	})
}
