package simnode

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is a sample app on loopback that plays an app container: it
// answers every request with 200 and a small JSON body, and counts what it
// receives, so a caller can check that denied requests never reach it.
type Backend struct {
	// URL is the backend's base URL (http://127.0.0.1:port).
	URL string
	// Addr is its host:port.
	Addr string

	srv    *http.Server
	hits   atomic.Int64
	mu     sync.Mutex
	byPath map[string]int64
}

// StartBackend starts a Backend named app (it appears in the answers).
func StartBackend(app string) (*Backend, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend listen: %w", err)
	}
	b := &Backend{Addr: l.Addr().String(), byPath: map[string]int64{}}
	b.URL = "http://" + b.Addr
	b.srv = &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.hits.Add(1)
			b.mu.Lock()
			b.byPath[r.URL.Path]++
			b.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, "{\"app\":%q,\"path\":%q}\n", app, r.URL.Path)
		}),
	}
	go func() { _ = b.srv.Serve(l) }()
	return b, nil
}

// Hits returns how many requests the backend has received.
func (b *Backend) Hits() int64 { return b.hits.Load() }

// PathHits returns how many requests for path the backend has received.
func (b *Backend) PathHits(path string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byPath[path]
}

// Close stops the backend.
func (b *Backend) Close() error { return b.srv.Close() }

var adminClient = &http.Client{Timeout: 5 * time.Second}

// MetricSum fetches a Prometheus text exposition from url and returns the
// sum of the samples of the metric name whose labels include every label
// in match (nil matches all). A metric with no such sample sums to 0.
func MetricSum(ctx context.Context, url, name string, match map[string]string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("reading %s: status %s", url, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		n, labels, value, err := ParseSample(line)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", url, err)
		}
		if n != name {
			continue
		}
		ok := true
		for k, v := range match {
			if labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			sum += value
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", url, err)
	}
	return sum, nil
}

// ParseSample parses one sample line of the Prometheus text format:
// name{label="value",...} value [timestamp].
func ParseSample(line string) (name string, labels map[string]string, value float64, err error) {
	bad := func(why string) error { return fmt.Errorf("sample %q: %s", line, why) }
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", nil, 0, bad("no metric name")
	}
	name, rest := line[:i], line[i:]
	labels = map[string]string{}
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, "=\"")
			if eq <= 0 {
				return "", nil, 0, bad("malformed labels")
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var v strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						v.WriteByte('\n')
					default:
						v.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest, closed = rest[j+1:], true
					break
				}
				v.WriteByte(c)
			}
			if !closed {
				return "", nil, 0, bad("unterminated label value")
			}
			labels[key] = v.String()
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, bad("no value")
	}
	value, err = strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, bad(err.Error())
	}
	return name, labels, value, nil
}
