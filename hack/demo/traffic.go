package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/test/simnode"
)

var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

type result struct {
	status  int
	header  http.Header
	body    string
	latency time.Duration
}

func (d *demo) send(method, path string, hdr ...string) (result, error) {
	req, err := http.NewRequest(method, d.sidecarURL+path, nil)
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	t := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return result{}, err
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return result{status: resp.StatusCode, header: resp.Header, body: string(body), latency: time.Since(t)}, nil
}

var shownHeaders = []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy", "Retry-After"}

func (d *demo) trafficPerRule(_ context.Context) error {
	hitsBefore := d.backend.Hits()
	type batch struct {
		label, method, path string
		n                   int
		hdr                 []string
	}
	batches := []batch{
		{"per-api-key   alice  GET /api/orders", http.MethodGet, "/api/orders", 8, []string{"X-API-Key", "alice"}},
		{"per-api-key   bob    GET /api/orders", http.MethodGet, "/api/orders", 3, []string{"X-API-Key", "bob"}},
		{"login-per-ip  127.0.0.1 POST /login", http.MethodPost, "/login", 5, nil},
	}
	var lastAllowed, firstDenied *result
	var allowed, denied int
	fmt.Printf("    %-40s %8s %7s   %s\n", "rule / client / request", "allowed", "denied", "statuses in order")
	for _, b := range batches {
		var a, dn int
		var seq []string
		for i := 0; i < b.n; i++ {
			r, err := d.send(b.method, b.path, b.hdr...)
			if err != nil {
				return err
			}
			seq = append(seq, strconv.Itoa(r.status))
			switch r.status {
			case http.StatusOK:
				a++
				if b.path == "/api/orders" {
					rr := r
					lastAllowed = &rr
				}
			case http.StatusTooManyRequests:
				dn++
				if firstDenied == nil {
					rr := r
					firstDenied = &rr
				}
			default:
				return fmt.Errorf("unexpected status %d: %s", r.status, r.body)
			}
		}
		allowed += a
		denied += dn
		fmt.Printf("    %-40s %8d %7d   %s\n", b.label, a, dn, strings.Join(seq, " "))
	}
	if lastAllowed != nil {
		show("last allowed response for alice: 200 with", headerLines(lastAllowed.header))
	}
	if firstDenied != nil {
		show("first denied response: 429 with", headerLines(firstDenied.header)+"\nContent-Type: "+firstDenied.header.Get("Content-Type")+"\n"+strings.TrimSpace(firstDenied.body))
	}
	reached := d.backend.Hits() - hitsBefore
	say("the app received %d requests: exactly the %d allowed; none of the %d denied reached it", reached, allowed, denied)
	if reached != int64(allowed) {
		return fmt.Errorf("the app received %d requests, but %d were allowed", reached, allowed)
	}
	shadow, err := d.metricSum(`floodgate_sidecar_decisions_total`, "rule=all-requests-shadow", "result=shadow_denied")
	if err != nil {
		return err
	}
	say("shadow rule all-requests-shadow (8 per minute per method): would have denied %.0f requests, blocked none", shadow)
	return nil
}

func headerLines(h http.Header) string {
	var lines []string
	for _, k := range shownHeaders {
		if v := h.Get(k); v != "" {
			lines = append(lines, k+": "+v)
		}
	}
	return strings.Join(lines, "\n")
}

func (d *demo) showRejection(ctx context.Context) error {
	bad := `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: broken
  namespace: shop
spec:
  podSelector: {}
  rules:
  - name: typo
    match:
      path: {type: RegularExpression, value: "/api/(v1|v2"}
    key: [{header: X-API-Key}]
    limit: {requests: 0, per: 10s}
`
	path := filepath.Join(d.work, "run", "broken.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		return err
	}
	out, err := d.kubectl.Run(ctx, "apply", "-f", path)
	if err == nil {
		return fmt.Errorf("an invalid policy was accepted: %s", out)
	}
	show("$ kubectl apply -f broken.yaml   (requests: 0)", out)
	bad = strings.Replace(bad, "requests: 0", "requests: 10", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		return err
	}
	out, err = d.kubectl.Run(ctx, "apply", "-f", path)
	if err == nil {
		return fmt.Errorf("a policy with an invalid regular expression was accepted: %s", out)
	}
	show("$ kubectl apply -f broken.yaml   (requests fixed, regex still broken: the validating webhook)", out)
	return nil
}

func (d *demo) editPolicy(ctx context.Context) error {
	rev0, err := d.revision()
	if err != nil {
		return err
	}
	path := filepath.Join(d.work, "run", "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML(20)), 0o644); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := d.kubectl.Run(ctx, "apply", "-f", path); err != nil {
		return err
	}
	applied := time.Since(t0)
	var probes int
	if err := simnode.Poll(ctx, 20*time.Millisecond, 30*time.Second, "the new limit in force", func() (bool, error) {
		probes++
		r, err := d.send(http.MethodGet, "/api/orders", "X-API-Key", fmt.Sprintf("probe-%d", probes))
		if err != nil {
			return false, err
		}
		return r.header.Get("X-Ratelimit-Limit") == "20", nil
	}); err != nil {
		return err
	}
	took := time.Since(t0)
	rev1, err := d.revision()
	if err != nil {
		return err
	}
	say("per-api-key changed from 5 to 20 requests per 10 s with kubectl apply (%s)", applied.Round(time.Millisecond))
	say("the sidecar enforced it %s after the apply began (revision %s -> %s)", took.Round(time.Millisecond), short(rev0), short(rev1))
	// Counters survive the edit: alice spent her 5 and keeps what she spent.
	r, err := d.send(http.MethodGet, "/api/orders", "X-API-Key", "alice")
	if err != nil {
		return err
	}
	say("alice's next request: Remaining %s of %s (her counter is kept across edits and refills at the new rate)",
		r.header.Get("X-Ratelimit-Remaining"), r.header.Get("X-Ratelimit-Limit"))
	return nil
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

func (d *demo) revision() (string, error) {
	return d.sidecar.Revision(context.Background())
}

// killMaster kills the master that holds the login counter, then drives
// steady traffic from many API keys and logins, second by second, until the
// replica has taken over.
func (d *demo) killMaster(ctx context.Context) error {
	port, err := d.masterHolding(ctx, "*login-per-ip*")
	if err != nil {
		return err
	}
	pid, err := os.ReadFile(filepath.Join(d.redisDir, fmt.Sprintf("node-%d.pid", port)))
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing the master on port %d: %w", port, err)
	}
	killed := time.Now()
	say("killed the Redis master on 127.0.0.1:%d (pid %d), which holds the login counter", port, n)
	fmt.Printf("    %-6s %9s %9s %9s %9s %12s   %s\n", "second", "200", "429", "503", "p99", "fallback", "note")

	const keys = 30
	hits0 := d.backend.Hits()
	var total struct{ ok, limited, unavailable int }
	seenFallback := false
	fbBefore, err := d.metricSum("floodgate_sidecar_fallback_decisions_total")
	if err != nil {
		return err
	}
	for sec := 1; sec <= 15; sec++ {
		var mu sync.Mutex
		var ok, limited, unavailable int
		var lat []time.Duration
		var wg sync.WaitGroup
		end := time.Now().Add(time.Second)
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; time.Now().Before(end); i++ {
					var r result
					var err error
					if i%10 == 0 {
						r, err = d.send(http.MethodPost, "/login")
					} else {
						r, err = d.send(http.MethodGet, "/api/orders", "X-API-Key", fmt.Sprintf("user-%d", (w*keys/4+i)%keys))
					}
					if err != nil {
						continue
					}
					mu.Lock()
					lat = append(lat, r.latency)
					switch r.status {
					case http.StatusOK:
						ok++
					case http.StatusTooManyRequests:
						limited++
					case http.StatusServiceUnavailable:
						unavailable++
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
			}(w)
		}
		wg.Wait()
		fb, err := d.metricSum("floodgate_sidecar_fallback_active")
		if err != nil {
			return err
		}
		fbNow, err := d.metricSum("floodgate_sidecar_fallback_decisions_total")
		if err != nil {
			return err
		}
		local := fbNow - fbBefore
		fbBefore = fbNow
		note := ""
		switch {
		case local > 0 && unavailable > 0:
			seenFallback = true
			note = "shard down: per-api-key on local buckets, logins refused"
		case local > 0:
			seenFallback = true
			note = "shard down: per-api-key on local buckets"
		case unavailable > 0:
			seenFallback = true
			note = "shard down: logins refused"
		case seenFallback:
			note = "replica promoted: shared counting again"
		}
		fmt.Printf("    %-6d %9d %9d %9d %9s %12.0f   %s\n", sec, ok, limited, unavailable, p99(lat).Round(10*time.Microsecond), fb, note)
		total.ok += ok
		total.limited += limited
		total.unavailable += unavailable
		if seenFallback && local == 0 && unavailable == 0 {
			break
		}
	}
	fbAllowed, err := d.metricSum("floodgate_sidecar_fallback_decisions_total", "result=allowed")
	if err != nil {
		return err
	}
	fbDenied, err := d.metricSum("floodgate_sidecar_fallback_decisions_total", "result=denied")
	if err != nil {
		return err
	}
	unavail, err := d.metricSum("floodgate_sidecar_decisions_total", "result=unavailable")
	if err != nil {
		return err
	}
	say("after %s: %d allowed, %d limited, %d refused with 503 (fail-closed login)", time.Since(killed).Round(100*time.Millisecond), total.ok, total.limited, total.unavailable)
	say("fallback decisions on local buckets: %.0f allowed, %.0f denied; fail-closed decisions: %.0f", fbAllowed, fbDenied, unavail)
	say("the app received %d requests in this phase, exactly the allowed ones", d.backend.Hits()-hits0)
	for _, a := range d.redisAddrs {
		if strings.HasSuffix(a, fmt.Sprintf(":%d", port)) {
			continue
		}
		_, p, _ := net.SplitHostPort(a)
		nodes, err := run(ctx, d.root, "redis-cli", "-p", p, "cluster", "nodes")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(nodes, "\n") {
			f := strings.Fields(l)
			if len(f) >= 3 {
				say("%-22s %s", strings.SplitN(f[1], "@", 2)[0], strings.ReplaceAll(f[2], "myself,", ""))
			}
		}
		break
	}
	return nil
}

// masterHolding returns the port of the master that holds a key matching
// pattern.
func (d *demo) masterHolding(ctx context.Context, pattern string) (int, error) {
	for _, a := range d.redisAddrs {
		_, portStr, err := net.SplitHostPort(a)
		if err != nil {
			return 0, err
		}
		port, _ := strconv.Atoi(portStr)
		role, err := run(ctx, d.root, "redis-cli", "-p", portStr, "role")
		if err != nil || !strings.HasPrefix(role, "master") {
			continue
		}
		keys, err := run(ctx, d.root, "redis-cli", "-p", portStr, "--scan", "--pattern", pattern)
		if err != nil {
			return 0, err
		}
		if keys != "" {
			return port, nil
		}
	}
	return 0, errors.New("no master holds a key matching " + pattern)
}

func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[(len(lat)*99)/100]
}

func (d *demo) showMetrics(_ context.Context) error {
	resp, err := client.Get(d.sidecarAdmin + "/metrics")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	var picked []string
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "floodgate_sidecar_decisions_total") || strings.HasPrefix(l, "floodgate_sidecar_local_denials_total") ||
			strings.HasPrefix(l, "floodgate_sidecar_config_info") || strings.HasPrefix(l, "floodgate_sidecar_decision_duration_seconds_count") {
			picked = append(picked, l)
		}
	}
	show("sidecar metrics: "+d.sidecarAdmin+"/metrics (a selection)", strings.Join(picked, "\n"))
	say("sidecar config in force: %s/debug/config", d.sidecarAdmin)
	say("manager metrics: http://%s/metrics; the Helm chart ships alerts and a Grafana dashboard on these", d.managerMet)
	say("logs: %s", filepath.Join(d.work, "run"))
	return nil
}

// metricSum adds the values of the sidecar's samples named name whose
// labels include every label=value pair in matchers.
func (d *demo) metricSum(name string, matchers ...string) (float64, error) {
	match := map[string]string{}
	for _, m := range matchers {
		k, v, ok := strings.Cut(m, "=")
		if !ok {
			return 0, fmt.Errorf("matcher %q: want label=value", m)
		}
		match[k] = v
	}
	return d.sidecar.Metric(context.Background(), name, match)
}
