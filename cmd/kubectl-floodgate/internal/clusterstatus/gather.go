package clusterstatus

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Sources are where Gather reads from.
type Sources struct {
	// Reader reads policies, pods, the ConfigMap and CounterStores.
	Reader client.Reader
	// Pods reaches the sidecars' admin port through the API server's pod
	// proxy (pods/proxy), which needs no network path to the pods.
	Pods corev1client.PodsGetter
}

// Options say what to gather.
type Options struct {
	Namespace string
	// Policy, when set, is the one policy to report on; otherwise every
	// policy of the namespace.
	Policy string
	// Window, when positive, scrapes the sidecars twice, Window apart, so
	// that the report shows recent decisions.
	Window time.Duration
	// ScrapeTimeout bounds each scrape; default 5s.
	ScrapeTimeout time.Duration
}

// maxScrapes bounds the scrapes in flight.
const maxScrapes = 16

// Gather reads the Input of Build from the cluster.
func Gather(ctx context.Context, src Sources, o Options) (Input, error) {
	in := Input{Namespace: o.Namespace, Window: o.Window, Stores: map[string]*v1alpha1.CounterStore{}}
	if o.Policy != "" {
		var p v1alpha1.RateLimitPolicy
		if err := src.Reader.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Policy}, &p); err != nil {
			return Input{}, fmt.Errorf("RateLimitPolicy %s/%s: %w", o.Namespace, o.Policy, err)
		}
		in.Policies = []v1alpha1.RateLimitPolicy{p}
	} else {
		var list v1alpha1.RateLimitPolicyList
		if err := src.Reader.List(ctx, &list, client.InNamespace(o.Namespace)); err != nil {
			return Input{}, fmt.Errorf("listing RateLimitPolicies in %s: %w", o.Namespace, err)
		}
		in.Policies = list.Items
	}
	var cm corev1.ConfigMap
	switch err := src.Reader.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: config.ConfigMapName}, &cm); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return Input{}, fmt.Errorf("ConfigMap %s/%s: %w", o.Namespace, config.ConfigMapName, err)
	default:
		c, err := config.Parse([]byte(cm.Data[config.DataKey]))
		if err != nil {
			in.ConfigErr = err.Error()
		} else {
			in.Config = c
		}
	}
	var pods corev1.PodList
	if err := src.Reader.List(ctx, &pods, client.InNamespace(o.Namespace)); err != nil {
		return Input{}, fmt.Errorf("listing pods in %s: %w", o.Namespace, err)
	}
	in.Pods = pods.Items
	for _, p := range in.Policies {
		name := p.StoreName()
		if _, done := in.Stores[name]; done {
			continue
		}
		var cs v1alpha1.CounterStore
		switch err := src.Reader.Get(ctx, client.ObjectKey{Name: name}, &cs); {
		case apierrors.IsNotFound(err):
			in.Stores[name] = nil
		case err != nil:
			return Input{}, fmt.Errorf("CounterStore %s: %w", name, err)
		default:
			in.Stores[name] = &cs
		}
	}
	targets := scrapeTargets(in.Pods)
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = 5 * time.Second
	}
	if o.Window > 0 {
		in.Before = scrapeAll(ctx, src.Pods, o, targets)
		t := time.NewTimer(o.Window)
		select {
		case <-ctx.Done():
			t.Stop()
			return Input{}, ctx.Err()
		case <-t.C:
		}
	}
	in.After = scrapeAll(ctx, src.Pods, o, targets)
	return in, nil
}

// target is a pod whose sidecar can be scraped, and its admin port.
type target struct {
	pod  string
	port int32
	err  string
}

// scrapeTargets lists the running pods with a floodgate sidecar.
func scrapeTargets(pods []corev1.Pod) []target {
	var out []target
	for i := range pods {
		pod := &pods[i]
		if !running(pod) || !hasSidecar(pod) {
			continue
		}
		t := target{pod: pod.Name, port: adminPort(pod)}
		switch {
		case pod.Status.PodIP == "":
			t.err = "the pod has no IP yet"
		case pod.Status.Phase != corev1.PodRunning:
			t.err = "the pod is " + string(pod.Status.Phase)
		}
		out = append(out, t)
	}
	return out
}

// adminPort is the sidecar container's port named fg-admin.
func adminPort(pod *corev1.Pod) int32 {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name != config.ContainerName {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == injection.AdminPortName {
					return p.ContainerPort
				}
			}
		}
	}
	return injection.DefaultAdminPort
}

func scrapeAll(ctx context.Context, pods corev1client.PodsGetter, o Options, targets []target) map[string]Scrape {
	out := make(map[string]Scrape, len(targets))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxScrapes)
	for _, t := range targets {
		if t.err != "" {
			out[t.pod] = Scrape{Err: t.err}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s := scrape(ctx, pods, o, t)
			mu.Lock()
			out[t.pod] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// scrape reads a sidecar's /metrics through the API server's pod proxy.
func scrape(ctx context.Context, pods corev1client.PodsGetter, o Options, t target) Scrape {
	ctx, cancel := context.WithTimeout(ctx, o.ScrapeTimeout)
	defer cancel()
	data, err := pods.Pods(o.Namespace).ProxyGet("http", t.pod, strconv.Itoa(int(t.port)), "metrics", nil).DoRaw(ctx)
	if err != nil {
		return Scrape{Err: fmt.Sprintf("reading /metrics through the pod proxy (port %d): %v", t.port, err)}
	}
	samples, err := ParseMetrics(data)
	if err != nil {
		return Scrape{Err: err.Error()}
	}
	return Scrape{Samples: samples}
}

// ParseMetrics reads the samples of the metrics Build uses from a
// Prometheus text exposition.
func ParseMetrics(data []byte) ([]Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	var out []Sample
	for _, name := range []string{MetricDecisions, MetricConfig, MetricFallback, MetricExempt} {
		mf := mfs[name]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := Sample{Name: name, Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				s.Value = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				s.Value = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				s.Value = m.GetUntyped().GetValue()
			}
			out = append(out, s)
		}
	}
	return out, nil
}
