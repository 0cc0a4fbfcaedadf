package kubesource

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func TestDesired(t *testing.T) {
	t.Parallel()
	const grace = 30 * time.Second
	tests := []struct {
		name   string
		st     state
		ok     bool
		status corev1.ConditionStatus
		reason string
		msg    []string
	}{
		{name: "nothing known before the first list", st: state{}, ok: false},
		{name: "listed, present, not yet delivered", st: state{synced: true, present: true}, ok: false},
		{name: "no ConfigMap", st: state{synced: true},
			ok: true, status: corev1.ConditionFalse, reason: config.ReasonWaitingForConfigMap, msg: []string{"shop/floodgate-policies"}},
		{name: "first document rejected", st: state{synced: true, present: true, seen: "r1", lastErr: "bad"},
			ok: true, status: corev1.ConditionFalse, reason: config.ReasonRejected, msg: []string{"revision r1", "no earlier revision is in force: bad"}},
		{name: "loaded", st: state{synced: true, present: true, seen: "r1", inForce: "r1"},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonLoaded, msg: []string{"r1"}},
		{name: "loaded but for one policy", st: state{synced: true, present: true, seen: "r1", inForce: "r1", failed: []string{"broken"}},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonPartiallyLoaded, msg: []string{"r1; not loaded: broken"}},
		{name: "later document rejected", st: state{synced: true, present: true, seen: "r2", inForce: "r1", lastErr: "bad"},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonRevisionRejected, msg: []string{"revision r1 stays in force", "revision r2 was rejected: bad"}},
		{name: "rejected document without a revision", st: state{synced: true, present: true, inForce: "r1", lastErr: "no config.json key"},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonRevisionRejected, msg: []string{"revision (unknown) was rejected"}},
		{name: "deleted within the grace period", st: state{synced: true, inForce: "r1"},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonConfigMapDeleted, msg: []string{"revision r1 stays in force for 30s"}},
		{name: "deleted past the grace period", st: state{synced: true, inForce: "sha256:empty", emptied: true},
			ok: true, status: corev1.ConditionTrue, reason: config.ReasonNoPolicies, msg: []string{"stayed deleted for 30s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, ok := desired(tt.st, "shop/"+config.ConfigMapName, grace)
			if ok != tt.ok {
				t.Fatalf("desired ok = %v, want %v (%+v)", ok, tt.ok, c)
			}
			if !ok {
				return
			}
			if c.Status != tt.status || c.Reason != tt.reason {
				t.Errorf("desired = %s/%s, want %s/%s", c.Status, c.Reason, tt.status, tt.reason)
			}
			for _, m := range tt.msg {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not contain %q", c.Message, m)
				}
			}
			if tt.reason == config.ReasonLoaded && c.Message != tt.st.inForce {
				t.Errorf("a Loaded message is %q, want exactly the revision %q", c.Message, tt.st.inForce)
			}
		})
	}
}

func TestDesiredBoundsTheMessage(t *testing.T) {
	t.Parallel()
	c, _ := desired(state{synced: true, present: true, inForce: "r1", lastErr: strings.Repeat("é", 2000)}, "shop/"+config.ConfigMapName, time.Second)
	if len(c.Message) > maxMessage || !strings.HasSuffix(c.Message, "...") {
		t.Errorf("message of %d bytes, want at most %d ending in ...", len(c.Message), maxMessage)
	}
	if !strings.HasPrefix(c.Message, "revision r1 stays in force") {
		t.Errorf("the truncated message lost its start: %q", c.Message[:40])
	}
}

func TestRevisionOf(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		`{"apiVersion":"floodgate.dev/sidecar-config/v1","revision":"sha256:ab"}`: "sha256:ab",
		`{"apiVersion":"floodgate.dev/sidecar-config/v1"}`:                        "",
		`not json`: "",
	} {
		if got := revisionOf([]byte(doc)); got != want {
			t.Errorf("revisionOf(%s) = %q, want %q", doc, got, want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := New(Options{DeleteGrace: -time.Second})
	if err == nil {
		t.Fatal("New accepted empty options")
	}
	for _, w := range []string{"Client is nil", "Namespace is empty", "PodName is empty", "DeleteGrace must not be negative"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	var cs kubernetes.Interface = &kubernetes.Clientset{}
	s, err := New(Options{Client: cs, Namespace: "shop", PodName: "api-0"})
	if err != nil {
		t.Fatal(err)
	}
	if s.o.DeleteGrace != DefaultDeleteGrace {
		t.Errorf("DeleteGrace = %v, want the default %v", s.o.DeleteGrace, DefaultDeleteGrace)
	}
}
