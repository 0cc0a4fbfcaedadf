package helmchart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// TestBadValuesAreRejected feeds values that must not install and checks
// that helm refuses them with a message naming the value and the reason:
// values.schema.json for types, enums, ranges and unknown keys, the chart's
// own checks for what a schema cannot say.
func TestBadValuesAreRejected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"replicas is not a number", []string{"--set", "replicaCount=two"},
			[]string{"at '/replicaCount': got string, want integer"}},
		{"unknown top-level key", []string{"--set", "replicas=2"},
			[]string{"additional properties 'replicas' not allowed"}},
		{"unknown nested key", []string{"--set", "webhook.prot=9443"},
			[]string{"at '/webhook': additional properties 'prot' not allowed"}},
		{"unknown key from a values file", []string{"-f", writeValues(t, "defaultStore:\n  managed:\n    shard: 3\n")},
			[]string{"at '/defaultStore/managed': additional properties 'shard' not allowed"}},
		{"no replicas", []string{"--set", "replicaCount=0"},
			[]string{"at '/replicaCount': minimum: got 0, want 1"}},
		{"log format outside the enum", []string{"--set", "logging.format=text"},
			[]string{"at '/logging/format': value must be one of 'json', 'console'"}},
		{"log level outside the set", []string{"--set", "logging.level=verbose"},
			[]string{"at '/logging/level'", "does not match pattern"}},
		{"privileged port", []string{"--set", "webhook.port=443"},
			[]string{"at '/webhook/port': minimum: got 443, want 1,024"}},
		{"webhook timeout above the API server's maximum", []string{"--set", "webhook.timeoutSeconds=31"},
			[]string{"at '/webhook/timeoutSeconds': maximum: got 31, want 30"}},
		{"managed store name too long for its StatefulSet", []string{"--set", "defaultStore.name=a-counter-store-name-of-forty-characters"},
			[]string{"at '/defaultStore/name': maxLength: got 40, want 39"}},
		{"managed store name with a dot", []string{"--set", "defaultStore.name=redis.default"},
			[]string{"at '/defaultStore/name'", "does not match pattern"}},
		{"zero shards", []string{"--set", "defaultStore.managed.shards=0"},
			[]string{"at '/defaultStore/managed/shards': minimum: got 0, want 1"}},
		{"too many replicas per shard", []string{"--set", "defaultStore.managed.replicasPerShard=6"},
			[]string{"at '/defaultStore/managed/replicasPerShard': maximum: got 6, want 5"}},
		{"anti-affinity outside the enum", []string{"--set", "defaultStore.managed.podAntiAffinity=Soft"},
			[]string{"at '/defaultStore/managed/podAntiAffinity': value must be one of 'Preferred', 'Required', 'None'"}},
		{"bad maxMemory quantity", []string{"--set", "defaultStore.managed.maxMemory=lots"},
			[]string{"at '/defaultStore/managed/maxMemory'", "does not match pattern"}},
		{"external store without addresses", []string{"--set", "defaultStore.mode=External"},
			[]string{"at '/defaultStore/external/addresses': minItems: got 0, want 1"}},
		{"bad external address", []string{"--set", "defaultStore.mode=External", "--set", "defaultStore.external.addresses={redis}"},
			[]string{"at '/defaultStore/external/addresses/0'", "does not match pattern"}},
		{"partial secret reference", []string{"--set", "defaultStore.external.passwordSecretRef.name=redis-auth"},
			[]string{"at '/defaultStore/external/passwordSecretRef'", "missing properties 'namespace', 'key'"}},
		{"a gateway peer that names nothing", []string{"-f", writeValues(t, "rateLimitService:\n  allowedGateways:\n    - {}\n")},
			[]string{"at '/rateLimitService/allowedGateways/0': minProperties: got 0, want 1"}},
		{"a gateway peer by address", []string{"-f", writeValues(t, "rateLimitService:\n  allowedGateways:\n    - ipBlock: {cidr: 0.0.0.0/0}\n")},
			[]string{"at '/rateLimitService/allowedGateways/0': additional properties 'ipBlock' not allowed"}},
		{"a gateway selector with a bad operator", []string{"-f", writeValues(t, "rateLimitService:\n  allowedGateways:\n    - podSelector: {matchExpressions: [{key: app, operator: Equals}]}\n")},
			[]string{"at '/rateLimitService/allowedGateways/0/podSelector/matchExpressions/0/operator'"}},
		{"root user", []string{"--set", "podSecurityContext.runAsUser=0"},
			[]string{"at '/podSecurityContext/runAsUser': minimum: got 0, want 1"}},
		{"turning the restricted profile off", []string{"--set", "podSecurityContext.runAsNonRoot=false"},
			[]string{"at '/podSecurityContext': additional properties 'runAsNonRoot' not allowed"}},
		{"issuerRef without a name", []string{"--set", "certManager.issuerRef.kind=ClusterIssuer"},
			[]string{"at '/certManager/issuerRef'", "missing property 'name'"}},
		{"bad certificate duration", []string{"--set", "certManager.duration=90days"},
			[]string{"at '/certManager/duration'", "does not match pattern"}},
		{"bad alert duration", []string{"--set", "monitoring.prometheusRule.decisionLatency.for=10min"},
			[]string{"at '/monitoring/prometheusRule/decisionLatency/for'", "does not match pattern"}},
		{"alert severity outside the enum", []string{"--set", "monitoring.prometheusRule.fallbackActive.severity=page"},
			[]string{"at '/monitoring/prometheusRule/fallbackActive/severity': value must be one of"}},
		{"deny ratio above 1", []string{"-f", writeValues(t, "monitoring:\n  prometheusRule:\n    denyRatioSpike:\n      minRatio: 1.5\n")},
			[]string{"at '/monitoring/prometheusRule/denyRatioSpike/minRatio': maximum: got 1.5, want 1"}},
		{"threshold that is not a number", []string{"--set", "monitoring.prometheusRule.decisionLatency.thresholdSeconds=fast"},
			[]string{"at '/monitoring/prometheusRule/decisionLatency/thresholdSeconds'", "does not match pattern"}},
		{"image digest that is a tag", []string{"--set", "image.digest=latest"},
			[]string{"at '/image/digest'", "does not match pattern"}},
		{"ports that collide", []string{"--set", "metrics.port=9443"},
			[]string{"metrics.port and webhook.port are both 9443: the manager's webhook, metrics and probe ports must differ"}},
		{"replicas without leader election", []string{"--set", "leaderElection.enabled=false"},
			[]string{"replicaCount is 2 but leaderElection.enabled is false"}},
		{"existing ServiceAccount without a name", []string{"--set", "serviceAccount.create=false"},
			[]string{"serviceAccount.name is required when serviceAccount.create is false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := helmtest.Run(t, helmtest.TemplateArgs(t, tc.args...)...)
			if r.Err == nil {
				t.Fatalf("helm template %s succeeded, want it rejected", strings.Join(tc.args, " "))
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Stderr, w) {
					t.Errorf("helm's error does not contain %q:\n%s", w, r.Stderr)
				}
			}
		})
	}
}

// TestGoodValuesAreAccepted checks values that the schema must let through
// (so that it is not stricter than the chart).
func TestGoodValuesAreAccepted(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"numeric log verbosity":             {"--set", "logging.level=3"},
		"decimal threshold from --set":      {"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.decisionLatency.thresholdSeconds=0.01"},
		"percentage PDB":                    {"--set-string", "podDisruptionBudget.maxUnavailable=50%"},
		"one replica without election":      {"--set", "replicaCount=1", "--set", "leaderElection.enabled=false"},
		"existing ServiceAccount":           {"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"},
		"no maxMemory":                      {"--set", "defaultStore.managed.maxMemory="},
		"replica-less store":                {"--set", "defaultStore.managed.replicasPerShard=0"},
		"issuer by name":                    {"--set", "certManager.enabled=true", "--set", "certManager.issuerRef.name=ca"},
		"IPv6 external store":               {"--set", "defaultStore.mode=External", "--set", "defaultStore.external.addresses={[fd00::1]:6379}"},
		"no RBAC":                           {"--set", "rbac.create=false"},
		"a gateway by namespace only":       {"-f", writeValues(t, "rateLimitService:\n  enabled: true\n  allowedGateways:\n    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}\n")},
		"external store with a dotted name": {"--set", "defaultStore.mode=External", "--set", "defaultStore.external.addresses={redis:6379}", "--set", "defaultStore.name=redis.shared"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if r := helmtest.Run(t, helmtest.TemplateArgs(t, args...)...); r.Err != nil {
				t.Fatal(r.Err)
			}
		})
	}
}

func writeValues(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
