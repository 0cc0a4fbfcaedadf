package kubesource

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// FieldManager is the field manager of the sidecar's pod status patches.
const FieldManager = "floodgate-sidecar"

// Backoff bounds of a failed status patch.
const (
	reportBackoffMin = 200 * time.Millisecond
	reportBackoffMax = 10 * time.Second
)

// reporter writes config.ConditionPolicyLoaded on the sidecar's own pod through
// the pods/status subresource. It keeps only the latest wanted condition:
// while the API server is unreachable it retries with backoff, and writes
// whatever is current when it comes back. Only its run goroutine calls the
// API; set may be called from any goroutine.
type reporter struct {
	client    kubernetes.Interface
	namespace string
	pod       string
	log       *slog.Logger

	wanted chan condition // capacity 1: the latest condition not yet taken
}

func newReporter(client kubernetes.Interface, namespace, pod string, log *slog.Logger) *reporter {
	return &reporter{client: client, namespace: namespace, pod: pod, log: log, wanted: make(chan condition, 1)}
}

// set replaces the condition to write.
func (r *reporter) set(c condition) {
	for {
		select {
		case r.wanted <- c:
			return
		default:
		}
		select {
		case <-r.wanted:
		default:
		}
	}
}

// run writes wanted conditions until ctx ends.
func (r *reporter) run(ctx context.Context) {
	written, since := r.current(ctx)
	var pending *condition
	backoff := reportBackoffMin
	var retry <-chan time.Time
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-r.wanted:
			pending = &c
		case <-retry:
		}
		retry = nil
		if pending == nil {
			continue
		}
		if written != nil && *written == *pending {
			pending = nil
			continue
		}
		transition := time.Now()
		if written != nil && written.Status == pending.Status && !since.IsZero() {
			transition = since
		}
		if err := r.patch(ctx, *pending, transition); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				r.log.Warn("cannot report the policy-loaded pod condition; retrying", "condition", pending.Reason, "err", err)
			}
			failing = true
			retry = time.After(backoff)
			backoff = min(2*backoff, reportBackoffMax)
			continue
		}
		if failing {
			r.log.Info("reporting the policy-loaded pod condition again")
		}
		failing, backoff = false, reportBackoffMin
		c := *pending
		written, since, pending = &c, transition, nil
		r.log.Debug("reported the policy-loaded pod condition", "status", c.Status, "reason", c.Reason, "message", c.Message)
	}
}

// current reads the condition already on the pod, written by an earlier
// run of the sidecar, so that its transition time is kept. It gives up
// quietly: the first write then sets the time afresh.
func (r *reporter) current(ctx context.Context) (*condition, time.Time) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The sidecar may read pods/status but not pods, so this is a GET of
	// the subresource, which returns the whole pod.
	var pod corev1.Pod
	err := r.client.CoreV1().RESTClient().Get().
		Namespace(r.namespace).Resource("pods").Name(r.pod).SubResource("status").
		Do(ctx).Into(&pod)
	if err != nil {
		r.log.Debug("cannot read the pod's conditions", "err", err)
		return nil, time.Time{}
	}
	pc := conditionOf(&pod)
	if pc == nil {
		return nil, time.Time{}
	}
	return &condition{Status: pc.Status, Reason: pc.Reason, Message: pc.Message}, pc.LastTransitionTime.Time
}

// patch writes c with a strategic merge patch of pods/status: the
// conditions list merges on type, so the kubelet's conditions are left
// alone.
func (r *reporter) patch(ctx context.Context, c condition, transition time.Time) error {
	body, err := json.Marshal(map[string]any{
		"status": map[string]any{
			"conditions": []map[string]any{{
				"type":               config.ConditionPolicyLoaded,
				"status":             c.Status,
				"reason":             c.Reason,
				"message":            c.Message,
				"lastTransitionTime": metav1.NewTime(transition),
				"lastProbeTime":      nil,
			}},
		},
	})
	if err != nil {
		return fmt.Errorf("marshal pod status patch: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = r.client.CoreV1().Pods(r.namespace).Patch(ctx, r.pod, types.StrategicMergePatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return fmt.Errorf("patch status of pod %s/%s: %w", r.namespace, r.pod, err)
	}
	return nil
}

// conditionOf returns the config.ConditionPolicyLoaded of pod, or nil.
func conditionOf(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == config.ConditionPolicyLoaded {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
