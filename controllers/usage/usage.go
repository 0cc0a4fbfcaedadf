// Package usage gathers what the sidecars' rules decided, for the
// policies' status: how many requests each enforced rule denied and each
// Shadow rule would have denied over a recent window.
//
// # How
//
// Every Interval, the Collector reads the usage report (config.UsagePath)
// of every running pod that has floodgate's sidecar, at the pod IP and the
// sidecar's admin port (the container port named injection.AdminPortName),
// a few pods at a time. The report holds each rule's counters since the
// sidecar started, and the start time, so a restarted sidecar is told
// apart from a quiet one. From the samples of the last Window the
// Collector computes each rule's increase per pod, sums the pods of each
// namespace, and, for every namespace whose numbers changed, sends an
// event that makes the policy controller write the status again.
//
// # Why not the pod status
//
// The sidecars could report their counts in a pod condition instead, as
// they report the config they enforce. But a pod status write costs the
// API server an etcd write and an event to every watcher of the pod
// (kubelet, endpoint controllers, this manager) for every report of every
// pod, where a read of a few hundred bytes from each pod costs the API
// server nothing. The price is that the manager must reach the pods'
// admin port: a NetworkPolicy that isolates a namespace must let the
// manager's namespace in on that port, or the status carries no counts.
// No RBAC is needed beyond the pod list the manager already has.
//
// Only the elected leader collects. A Collector is safe for concurrent
// use.
package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Options configure a Collector.
type Options struct {
	// Interval is how often the sidecars are read; default 10s.
	Interval time.Duration
	// Window is the span the counts cover; default 5m.
	Window time.Duration
	// Timeout bounds one read; default 2s.
	Timeout time.Duration
	// Workers is how many pods are read at once; default 8.
	Workers int
	// Client reads the reports; default a client with Timeout.
	Client *http.Client
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.Window <= 0 {
		o.Window = 5 * time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Timeout, Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: o.Timeout}).DialContext,
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     2 * o.Interval,
		}}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Collector gathers the sidecars' usage reports. Create it with New.
type Collector struct {
	reader  client.Reader
	o       Options
	updates chan event.GenericEvent

	mu      sync.Mutex
	pods    map[types.UID]*series
	usage   map[string]map[string]*policy.PolicyUsage // namespace, policy name
	pending map[string]bool                           // namespaces whose event was not sent
}

var (
	_ policy.UsageSource             = (*Collector)(nil)
	_ manager.Runnable               = (*Collector)(nil)
	_ manager.LeaderElectionRunnable = (*Collector)(nil)
)

// New returns a Collector that lists pods with reader (the manager's
// cache).
func New(reader client.Reader, o Options) *Collector {
	o.setDefaults()
	return &Collector{
		reader:  reader,
		o:       o,
		updates: make(chan event.GenericEvent, 1024),
		pods:    map[types.UID]*series{},
		usage:   map[string]map[string]*policy.PolicyUsage{},
		pending: map[string]bool{},
	}
}

// series is what was read of one pod.
type series struct {
	namespace string
	samples   []sample // oldest first
	failing   bool     // the last read failed
}

// sample is one usage report.
type sample struct {
	at      time.Time
	started time.Time
	rules   map[ruleKey]config.RuleUsage
}

type ruleKey struct{ policy, rule string }

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader collects, as only the leader writes status.
func (c *Collector) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it collects every Interval until ctx
// ends.
func (c *Collector) Start(ctx context.Context) error {
	t := time.NewTicker(c.o.Interval)
	defer t.Stop()
	for {
		c.Collect(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Updates implements policy.UsageSource.
func (c *Collector) Updates() <-chan event.GenericEvent { return c.updates }

// For implements policy.UsageSource.
func (c *Collector) For(namespace, name string) *policy.PolicyUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usage[namespace][name]
}

// target is a pod to read.
type target struct {
	uid             types.UID
	namespace, name string
	url             string
}

// targets lists the running pods with floodgate's sidecar and its admin
// port.
func targets(pods []corev1.Pod) []target {
	var out []target
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
			continue
		}
		// The sidecar is a native sidecar (an init container that keeps
		// running) where the cluster has them, else a container.
		for _, ctr := range append(slices.Clip(pod.Spec.InitContainers), pod.Spec.Containers...) {
			if ctr.Name != config.ContainerName {
				continue
			}
			for _, p := range ctr.Ports {
				if p.Name == injection.AdminPortName {
					host := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(p.ContainerPort)))
					out = append(out, target{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, url: "http://" + host + config.UsagePath})
				}
			}
		}
	}
	return out
}

// Collect reads every sidecar once and updates the usage. Start calls it
// every Interval; tests call it directly.
func (c *Collector) Collect(ctx context.Context) {
	var pods corev1.PodList
	if err := c.reader.List(ctx, &pods); err != nil {
		log.FromContext(ctx).Error(err, "usage: listing pods")
		return
	}
	ts := targets(pods.Items)
	reports := make([]*config.Usage, len(ts))
	errs := make([]error, len(ts))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(c.o.Workers, len(ts)) {
		wg.Go(func() {
			for i := range work {
				reports[i], errs[i] = c.read(ctx, ts[i].url)
			}
		})
	}
	for i := range ts {
		work <- i
	}
	close(work)
	wg.Wait()

	now := c.o.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	live := map[types.UID]bool{}
	for i, t := range ts {
		live[t.uid] = true
		s := c.pods[t.uid]
		if s == nil {
			s = &series{namespace: t.namespace}
			c.pods[t.uid] = s
		}
		u := reports[i]
		if u == nil {
			// Say so once per failing spell: a NetworkPolicy that keeps
			// the manager from the admin port shows here.
			if !s.failing {
				log.FromContext(ctx).Info("usage: cannot read a sidecar's usage report; its counts are missing from the status", "pod", t.namespace+"/"+t.name, "url", t.url, "error", errs[i].Error())
			}
			s.failing = true
			continue
		}
		if s.failing {
			log.FromContext(ctx).Info("usage: reading the sidecar's usage report again", "pod", t.namespace+"/"+t.name)
		}
		s.failing = false
		smp := sample{at: now, started: u.Started, rules: map[ruleKey]config.RuleUsage{}}
		for _, r := range u.Rules {
			smp.rules[ruleKey{r.Policy, r.Rule}] = r
		}
		s.samples = append(s.samples, smp)
		s.prune(now.Add(-c.o.Window))
	}
	for uid := range c.pods {
		if !live[uid] {
			delete(c.pods, uid)
		}
	}
	next := c.aggregate(now)
	for ns := range union(next, c.usage) {
		if !reflect.DeepEqual(next[ns], c.usage[ns]) {
			c.pending[ns] = true
		}
	}
	c.usage = next
	for ns := range c.pending {
		select {
		case c.updates <- event.GenericEvent{Object: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}:
			delete(c.pending, ns)
		default:
			// The controller is behind: try again next round.
		}
	}
}

func union[V any](a, b map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range maps.Keys(a) {
		out[k] = true
	}
	for k := range maps.Keys(b) {
		out[k] = true
	}
	return out
}

// maxReport bounds a usage report; a sidecar's is a few hundred bytes per
// rule.
const maxReport = 4 << 20

func (c *Collector) read(ctx context.Context, url string) (*config.Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.o.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	var u config.Usage
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReport)).Decode(&u); err != nil {
		return nil, fmt.Errorf("decode the usage report: %w", err)
	}
	if u.Started.IsZero() {
		return nil, errors.New("the usage report has no start time")
	}
	return &u, nil
}

// prune drops the samples older than the newest one at or before since,
// which stays as the baseline of the window.
func (s *series) prune(since time.Time) {
	base := 0
	for i, smp := range s.samples {
		if !smp.at.After(since) {
			base = i
		}
	}
	s.samples = s.samples[base:]
}

// increase returns the rule's counts over the window: the sum of the
// increases between consecutive samples, a restart counting the new
// values whole; and the counts of the first sample too when the sidecar
// started within the window, since they all happened in it.
func (s *series) increase(k ruleKey, since time.Time) (out config.RuleUsage, seen bool) {
	add := func(v config.RuleUsage) {
		out.Denied += v.Denied
		out.ShadowDenied += v.ShadowDenied
		out.Exempt += v.Exempt
	}
	first := s.samples[0]
	if v, ok := first.rules[k]; ok {
		seen = true
		if first.started.After(since) {
			add(v)
		}
	}
	for i := 1; i < len(s.samples); i++ {
		prev, cur := s.samples[i-1], s.samples[i]
		v, ok := cur.rules[k]
		if !ok {
			continue
		}
		seen = true
		p, had := prev.rules[k]
		if !had || !cur.started.Equal(prev.started) {
			add(v)
			continue
		}
		add(config.RuleUsage{Denied: sub(v.Denied, p.Denied), ShadowDenied: sub(v.ShadowDenied, p.ShadowDenied), Exempt: sub(v.Exempt, p.Exempt)})
	}
	return out, seen
}

// sub is a-b for a counter: a smaller a means the counter restarted.
func sub(a, b uint64) uint64 {
	if a < b {
		return a
	}
	return a - b
}

// aggregate sums the pods' increases per namespace and policy.
func (c *Collector) aggregate(now time.Time) map[string]map[string]*policy.PolicyUsage {
	since := now.Add(-c.o.Window)
	out := map[string]map[string]*policy.PolicyUsage{}
	for _, s := range c.pods {
		if len(s.samples) == 0 {
			continue
		}
		keys := map[ruleKey]bool{}
		for _, smp := range s.samples {
			for k := range smp.rules {
				keys[k] = true
			}
		}
		policies := map[string]bool{}
		for k := range keys {
			inc, seen := s.increase(k, since)
			if !seen {
				continue
			}
			byPolicy := out[s.namespace]
			if byPolicy == nil {
				byPolicy = map[string]*policy.PolicyUsage{}
				out[s.namespace] = byPolicy
			}
			pu := byPolicy[k.policy]
			if pu == nil {
				pu = &policy.PolicyUsage{Window: c.o.Window, Rules: map[string]policy.RuleCounts{}}
				byPolicy[k.policy] = pu
			}
			rc := pu.Rules[k.rule]
			rc.Denied += int64(inc.Denied)
			rc.ShadowDenied += int64(inc.ShadowDenied)
			rc.Exempt += int64(inc.Exempt)
			pu.Rules[k.rule] = rc
			if !policies[k.policy] {
				policies[k.policy] = true
				pu.Pods++
			}
		}
	}
	return out
}
