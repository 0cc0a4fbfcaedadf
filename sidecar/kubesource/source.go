// Package kubesource is floodgate-sidecar's Kubernetes mode: a
// configsource.Source that watches the namespace's "floodgate-policies"
// ConfigMap through a client-go informer, and reports what the runner did
// with each document as the pod condition config.ConditionPolicyLoaded.
//
// # Least privilege
//
// The informer lists and watches one object: the ConfigMap named
// Options.ConfigMapName (config.ConfigMapName unless the sidecar serves as
// the central rate-limit service) in the sidecar's namespace, selected with a
// metadata.name field selector. The API server authorizes such a list or
// watch against the object's name, so the sidecar's Role can grant
// get/list/watch on that single resourceName and nothing else. The
// condition is written with get/patch on pods/status; RBAC cannot limit
// that to the sidecar's own pod, so the sidecar only ever names its own
// pod (Options.PodName, from the downward API).
//
// # What is delivered
//
// Every new content of the ConfigMap's config.DataKey is delivered once;
// the informer's relists and resyncs, which repeat the same bytes, are
// not. A ConfigMap without that key is delivered as an error, which the
// runner reports while it keeps the last good config.
//
// Nothing is delivered while the API server is unreachable: the informer
// keeps its last state and retries with backoff, and the runner keeps the
// config in force. Watch failures are logged (client-go retries a refused
// connection quietly), not reported on the pod, because the pod condition
// cannot be written either.
//
// # A deleted ConfigMap
//
// floodgate-manager deletes the ConfigMap when no policy of the namespace
// has anything to enforce, and recreates it at once when someone else
// deletes it while policies exist. The source therefore keeps the config in
// force for Options.DeleteGrace (default 30s) after a deletion, reporting
// config.ReasonConfigMapDeleted, so that a deletion undone by the manager never
// opens a gap in enforcement. If the ConfigMap is still absent after the
// grace period, the source delivers a document with the same store and no
// policies, and reports config.ReasonNoPolicies: deleting the last policy of a
// namespace does stop its limits.
package kubesource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/configsource"
)

// DefaultDeleteGrace is how long the config in force outlives a deletion of
// the ConfigMap by default.
const DefaultDeleteGrace = 30 * time.Second

// Options configure a Source.
type Options struct {
	// Client talks to the API server with the pod's identity.
	Client kubernetes.Interface
	// Namespace is the pod's namespace, which holds the ConfigMap.
	Namespace string
	// ConfigMapName is the ConfigMap to watch; empty means
	// config.ConfigMapName, a namespace's sidecar document. The central
	// rate-limit service watches config.RateLimitServiceConfigMapName.
	ConfigMapName string
	// PodName is the pod whose condition the source writes.
	PodName string
	// Log receives the source's events; nil discards them.
	Log *slog.Logger
	// DeleteGrace is how long the config in force outlives a deletion of
	// the ConfigMap; 0 means DefaultDeleteGrace.
	DeleteGrace time.Duration
}

// Source is a configsource.Source backed by the namespace's ConfigMap. Create it
// with New; Run may be called once.
type Source struct {
	o   Options
	log *slog.Logger
}

var _ configsource.Source = (*Source)(nil)

// New validates o and returns a Source.
func New(o Options) (*Source, error) {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("kubesource: Client is nil"))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("kubesource: Namespace is empty"))
	}
	if o.PodName == "" {
		errs = append(errs, errors.New("kubesource: PodName is empty"))
	}
	if o.DeleteGrace < 0 {
		errs = append(errs, fmt.Errorf("kubesource: DeleteGrace must not be negative, got %v", o.DeleteGrace))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.DeleteGrace == 0 {
		o.DeleteGrace = DefaultDeleteGrace
	}
	if o.ConfigMapName == "" {
		o.ConfigMapName = config.ConfigMapName
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{o: o, log: log.With("component", "kubesource")}, nil
}

// observed is the informer's latest view of the ConfigMap; cm is nil when
// it does not exist.
type observed struct {
	cm *corev1.ConfigMap
}

// latest holds the newest observation for the Run loop, dropping the ones
// the loop has not taken yet: the loop is level-based.
type latest struct{ ch chan observed }

func (l latest) set(o observed) {
	for {
		select {
		case l.ch <- o:
			return
		default:
		}
		select {
		case <-l.ch:
		default:
		}
	}
}

// Run implements configsource.Source. It delivers the ConfigMap's document and
// every change of it until ctx ends, and keeps the pod condition current.
func (s *Source) Run(ctx context.Context, deliver func(configsource.Update)) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	rep := newReporter(s.o.Client, s.o.Namespace, s.o.PodName, s.log)
	repDone := make(chan struct{})
	go func() {
		defer close(repDone)
		rep.run(ctx)
	}()
	defer func() { cancel(); <-repDone }()

	events := latest{ch: make(chan observed, 1)}
	factory := informers.NewSharedInformerFactoryWithOptions(s.o.Client, 0,
		informers.WithNamespace(s.o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.o.ConfigMapName).String()
		}))
	defer factory.Shutdown()
	inf := factory.Core().V1().ConfigMaps().Informer()
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.log.Warn("watching the ConfigMap failed; the config in force stays, retrying", "configmap", s.o.ConfigMapName, "err", err)
	}); err != nil {
		s.log.Error("cannot set the watch error handler", "err", err)
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { events.set(observed{cm: asConfigMap(obj)}) },
		UpdateFunc: func(_, obj any) { events.set(observed{cm: asConfigMap(obj)}) },
		DeleteFunc: func(any) { events.set(observed{}) },
	})
	if err != nil {
		// AddEventHandler fails only on a stopped informer, which this
		// one cannot be yet.
		s.log.Error("cannot watch the ConfigMap", "err", err)
		return
	}
	factory.Start(ctx.Done())
	synced := make(chan struct{})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			close(synced)
		}
	}()

	l := loop{s: s, deliver: deliver, rep: rep}
	var grace *time.Timer
	var graceC <-chan time.Time
	stopGrace := func() {
		if grace != nil {
			grace.Stop()
			grace, graceC = nil, nil
		}
	}
	defer stopGrace()
	for {
		select {
		case <-ctx.Done():
			return
		case <-synced:
			synced = nil
			l.st.synced = true
			// An absent ConfigMap produced no event; this is when the
			// source learns of it.
			if !l.st.present {
				l.report()
			}
		case o := <-events.ch:
			wasPresent := l.st.present
			l.observe(o)
			switch {
			case l.st.present:
				stopGrace()
			case wasPresent && l.st.inForce != "" && !l.st.emptied:
				stopGrace()
				grace = time.NewTimer(s.o.DeleteGrace)
				graceC = grace.C
				s.log.Warn("the ConfigMap was deleted; keeping the config in force for the grace period",
					"revision", l.st.inForce, "grace", s.o.DeleteGrace)
			}
		case <-graceC:
			grace, graceC = nil, nil
			if !l.st.present {
				l.empty()
			}
		}
	}
}

func asConfigMap(obj any) *corev1.ConfigMap {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm == nil {
		return nil
	}
	return cm
}

// loop is the state of one Run; only Run's goroutine touches it.
type loop struct {
	s       *Source
	deliver func(configsource.Update)
	rep     *reporter
	st      state

	delivered []byte // the last document delivered, nil after an error
	errKey    string // the last error delivered, to deliver it once
	store     *config.Store
}

// observe handles the informer's view of the ConfigMap.
func (l *loop) observe(o observed) {
	if o.cm == nil {
		if l.st.present {
			l.st.present = false
			l.report()
		}
		return
	}
	l.st.present = true
	origin := fmt.Sprintf("configmap %s/%s (resourceVersion %s)", o.cm.Namespace, o.cm.Name, o.cm.ResourceVersion)
	data, ok := o.cm.Data[config.DataKey]
	if !ok {
		errText := fmt.Sprintf("ConfigMap %s/%s has no %q key", o.cm.Namespace, o.cm.Name, config.DataKey)
		if l.delivered == nil && l.errKey == errText {
			l.report()
			return
		}
		l.delivered, l.errKey, l.st.seen = nil, errText, ""
		l.send(configsource.Update{Err: errors.New(errText), Origin: origin})
		return
	}
	if l.delivered != nil && bytes.Equal(l.delivered, []byte(data)) {
		// A relist or resync: same bytes, already handled.
		l.report()
		return
	}
	l.delivered, l.errKey, l.st.seen = []byte(data), "", revisionOf([]byte(data))
	if c, err := config.Parse([]byte(data)); err == nil {
		store := c.Store
		l.store = &store
	}
	l.send(configsource.Update{Data: []byte(data), Origin: origin})
}

// empty delivers a document with the last store and no policies, after the
// ConfigMap stayed deleted for the grace period.
func (l *loop) empty() {
	doc := config.Config{APIVersion: config.APIVersion, Policies: []config.Policy{}}
	if l.store != nil {
		doc.Store = *l.store
	}
	data, err := json.Marshal(doc)
	if err != nil {
		l.s.log.Error("cannot build the empty document", "err", err)
		return
	}
	l.s.log.Warn("the ConfigMap stayed deleted; enforcing no policy", "grace", l.s.o.DeleteGrace)
	l.delivered, l.errKey, l.st.seen = data, "", ""
	l.send(configsource.Update{Data: data, Origin: "configmap " + l.s.o.Namespace + "/" + l.s.o.ConfigMapName + " (deleted)"})
	if l.st.lastErr == "" {
		l.st.emptied = true
	}
	l.report()
}

// send delivers u and records what the runner did with it.
func (l *loop) send(u configsource.Update) {
	u.Result = func(o configsource.Outcome) {
		l.st.inForce = o.InForce
		l.st.emptied = false
		l.st.lastErr = ""
		if o.Err != nil {
			l.st.lastErr = o.Err.Error()
		}
		l.st.failed = o.Failed
	}
	l.deliver(u)
	l.report()
}

// report hands the condition that describes the state to the reporter.
func (l *loop) report() {
	if c, ok := desired(l.st, l.s.o.Namespace+"/"+l.s.o.ConfigMapName, l.s.o.DeleteGrace); ok {
		l.rep.set(c)
	}
}

// revisionOf reads a document's revision without validating it; empty when
// the document has none or cannot be read.
func revisionOf(data []byte) string {
	var doc struct {
		Revision string `json:"revision"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return ""
	}
	return doc.Revision
}
