package helmchart

import (
	"strconv"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// TestManagerKeepsServingWebhooksWhileStopping: a stopping manager pod
// sleeps shutdownDelaySeconds in preStop before it gets SIGTERM, so that
// kube-proxy stops routing admission requests to it before its webhook
// server closes (on a real node, a rolling restart refused an opted-in pod
// with "connection refused" otherwise), and the delay plus
// --graceful-shutdown-timeout fits in terminationGracePeriodSeconds.
func TestManagerKeepsServingWebhooksWhileStopping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		set   []string
		delay int64
	}{
		{nil, 5},
		{[]string{"--set", "shutdownDelaySeconds=10", "--set", "terminationGracePeriodSeconds=15"}, 10},
		{[]string{"--set", "shutdownDelaySeconds=0"}, 0},
	} {
		d := helmtest.Manifest(t, tc.set...).Get(t, "Deployment", "floodgate-manager")
		spec := d.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		c := spec["containers"].([]any)[0].(map[string]any)
		var got int64
		if lc, ok := c["lifecycle"].(map[string]any); ok {
			got = num(lc["preStop"].(map[string]any)["sleep"].(map[string]any)["seconds"])
		}
		if got != tc.delay {
			t.Errorf("%v: preStop sleep %d s, want %d", tc.set, got, tc.delay)
		}
		grace := num(spec["terminationGracePeriodSeconds"])
		var shutdown int64
		for _, a := range c["args"].([]any) {
			if v, ok := strings.CutPrefix(a.(string), "--graceful-shutdown-timeout="); ok {
				shutdown, _ = strconv.ParseInt(strings.TrimSuffix(v, "s"), 10, 64)
			}
		}
		if got+shutdown > grace {
			t.Errorf("%v: preStop %d s + graceful shutdown %d s exceed the grace period %d s", tc.set, got, shutdown, grace)
		}
	}
	if r := helmtest.Run(t, helmtest.TemplateArgs(t, "--set", "shutdownDelaySeconds=11")...); r.Err == nil {
		t.Error("shutdownDelaySeconds=11 rendered; the schema allows at most 10")
	}
}

// num reads a number of a rendered manifest, decoded as int64 or float64.
func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return -1
}
