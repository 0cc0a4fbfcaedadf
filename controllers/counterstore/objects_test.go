package counterstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

func testStore() *v1alpha1.CounterStore {
	return &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", UID: types.UID("uid-1")},
		Spec: v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{
			Shards:           3,
			ReplicasPerShard: 1,
			Image:            DefaultImage,
			NodeTimeout:      &metav1.Duration{Duration: 2 * time.Second},
			PodAntiAffinity:  v1alpha1.AntiAffinityPreferred,
		}},
	}
}

func TestRedisConf(t *testing.T) {
	t.Parallel()
	cs := testStore()
	conf := RedisConf(cs)
	for _, want := range []string{
		"cluster-enabled yes\n", "cluster-node-timeout 2000\n", `save ""` + "\n", "appendonly no\n",
		"cluster-config-file /data/nodes.conf\n", "cluster-require-full-coverage no\n",
		"cluster-replica-validity-factor 0\n", "cluster-allow-replica-migration no\n", "port 6379\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("redis.conf lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "maxmemory") {
		t.Errorf("redis.conf sets maxmemory without spec.managed.maxMemory:\n%s", conf)
	}
	if strings.Contains(conf, "requirepass") || strings.Contains(conf, "bind") {
		t.Errorf("redis.conf carries per-Pod or secret settings, which the start script adds:\n%s", conf)
	}
	cs.Spec.Managed.MaxMemory = ptr.To(resource.MustParse("256Mi"))
	conf = RedisConf(cs)
	if !strings.Contains(conf, "maxmemory 268435456\n") || !strings.Contains(conf, "maxmemory-policy volatile-ttl\n") {
		t.Errorf("redis.conf with maxMemory 256Mi:\n%s", conf)
	}
	cs.Spec.Managed.NodeTimeout = nil
	if conf := RedisConf(cs); !strings.Contains(conf, "cluster-node-timeout 5000\n") {
		t.Errorf("default node timeout missing:\n%s", conf)
	}
}

func TestDesiredStatefulSet(t *testing.T) {
	t.Parallel()
	cs := testStore()
	cs.Spec.Managed.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("300Mi")}}
	cs.Spec.Managed.Tolerations = []corev1.Toleration{{Key: "redis", Operator: corev1.TolerationOpExists}}
	cs.Spec.Managed.NodeSelector = map[string]string{"pool": "cache"}
	sts := DesiredStatefulSet(cs, "floodgate-system", 6, "0123456789abcdef0123")

	if got, want := sts.Name, "counterstore-orders"; got != want {
		t.Errorf("name = %s, want %s", got, want)
	}
	if got := *sts.Spec.Replicas; got != 6 {
		t.Errorf("replicas = %d, want 6", got)
	}
	if refs := sts.OwnerReferences; len(refs) != 1 || refs[0].UID != cs.UID || !*refs[0].Controller || refs[0].Kind != "CounterStore" {
		t.Errorf("owner references = %+v", refs)
	}
	for k, v := range sts.Spec.Selector.MatchLabels {
		if sts.Spec.Template.Labels[k] != v {
			t.Errorf("template lacks selector label %s=%s", k, v)
		}
	}
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	if c.Image != DefaultImage || len(c.Command) != 3 || c.Command[2] != StartScript("/etc/redis", "/data") {
		t.Errorf("container image %q command %q", c.Image, c.Command)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["POD_IP"]; e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP = %+v", e)
	}
	for _, name := range []string{"REDIS_PASSWORD", "REDISCLI_AUTH"} {
		e := env[name]
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "counterstore-orders-auth" || e.ValueFrom.SecretKeyRef.Key != PasswordKey ||
			ptr.Deref(e.ValueFrom.SecretKeyRef.Optional, false) {
			t.Errorf("%s = %+v", name, e)
		}
	}
	// The admin password is the only one the Pods get: the namespaces'
	// users are set on the running nodes.
	if len(env) != 3 {
		t.Errorf("env = %v, want POD_IP and the admin password alone", env)
	}
	if c.Resources.Limits.Memory().String() != "300Mi" {
		t.Errorf("resources = %+v", c.Resources)
	}
	if len(pod.Tolerations) != 1 || pod.NodeSelector["pool"] != "cache" {
		t.Errorf("tolerations %v, node selector %v", pod.Tolerations, pod.NodeSelector)
	}
	if !*pod.SecurityContext.RunAsNonRoot || !*c.SecurityContext.ReadOnlyRootFilesystem || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Error("the Redis container does not run restricted")
	}
	if a := pod.Affinity.PodAntiAffinity; a == nil || len(a.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("Preferred anti-affinity = %+v", pod.Affinity)
	}

	cs.Spec.Managed.PodAntiAffinity = v1alpha1.AntiAffinityRequired
	if a := DesiredStatefulSet(cs, "ns", 6, "p").Spec.Template.Spec.Affinity.PodAntiAffinity; len(a.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != corev1.LabelHostname {
		t.Errorf("Required anti-affinity = %+v", a)
	}
	cs.Spec.Managed.PodAntiAffinity = v1alpha1.AntiAffinityNone
	if a := DesiredStatefulSet(cs, "ns", 6, "p").Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("None anti-affinity = %+v", a)
	}

	// A config or password change changes the template, so Pods roll.
	before := sts.Spec.Template.Annotations
	cs.Spec.Managed.NodeTimeout = &metav1.Duration{Duration: 3 * time.Second}
	after := DesiredStatefulSet(cs, "ns", 6, "0123456789abcdef0123").Spec.Template.Annotations
	if before[ConfigHashAnnotation] == after[ConfigHashAnnotation] {
		t.Error("config hash unchanged by a node timeout change")
	}
	if other := DesiredStatefulSet(cs, "ns", 6, "another-password-00").Spec.Template.Annotations; other[AuthHashAnnotation] == after[AuthHashAnnotation] {
		t.Error("auth hash unchanged by a password change")
	}
	if strings.Contains(strings.Join(c.Command, " "), "0123456789abcdef0123") {
		t.Error("the password appears in the command line")
	}
}

func TestDesiredChildren(t *testing.T) {
	t.Parallel()
	cs := testStore()
	svc := DesiredService(cs, "ns")
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || len(svc.Spec.Ports) != 2 {
		t.Errorf("service spec = %+v", svc.Spec)
	}
	pdb := DesiredPDB(cs, "ns")
	if pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("pdb maxUnavailable = %v", pdb.Spec.MaxUnavailable)
	}
	creds := Credentials{Admin: "admin-password-0123"}
	sec := DesiredSecret(cs, "ns", creds)
	if sec.Name != "counterstore-orders-auth" || len(sec.Data) != 1 || string(sec.Data[PasswordKey]) != creds.Admin {
		t.Errorf("secret = %+v", sec)
	}
	if got, err := CredentialsFrom(sec); err != nil || got != creds {
		t.Errorf("CredentialsFrom(DesiredSecret(%+v)) = %+v, %v", creds, got, err)
	}
	sec.Data[PasswordKey] = []byte("short")
	if _, err := CredentialsFrom(sec); err == nil || !strings.Contains(err.Error(), `key "password"`) {
		t.Errorf("CredentialsFrom with a short admin password: %v, want an error naming the key", err)
	}

	// A namespace's user Secret: asked for empty, filled in by the store's
	// controller, owned by the store, named apart for any namespace.
	if a, b := UserSecretName("orders", "team-a"), UserSecretName("orders", "team-b"); a == b || !strings.HasPrefix(a, "counterstore-orders-user-") || len(a) > 63 {
		t.Errorf("user Secret names %q and %q", a, b)
	}
	asked := NewUserSecret(cs, "ns", "team-a")
	if len(asked.Data) != 0 || asked.Labels[UserNamespaceLabel] != "team-a" || asked.Labels[UserStoreLabel] != "orders" ||
		len(asked.OwnerReferences) != 1 || !ptr.Deref(asked.OwnerReferences[0].Controller, false) {
		t.Errorf("asked-for user Secret = %+v", asked)
	}
	uc := UserCredentials{Password: "team-a-password-01", Rotated: "1"}
	us := DesiredUserSecret(cs, "ns", "team-a", uc)
	if us.Name != asked.Name || string(us.Data[UserPasswordKey]) != uc.Password || us.Annotations[RotatedAnnotation] != "1" || len(us.Data) != 1 {
		t.Errorf("user secret = %+v", us)
	}
	if got, rotate, err := UserCredentialsFrom(us); err != nil || got != uc || rotate != "" {
		t.Errorf("UserCredentialsFrom(DesiredUserSecret(%+v)) = %+v, %q, %v", uc, got, rotate, err)
	}
	uc.Previous, uc.PreviousExpires = "previous-password-1", time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	us = DesiredUserSecret(cs, "ns", "team-a", uc)
	if string(us.Data[PreviousUserPasswordKey]) != uc.Previous || us.Annotations[PreviousExpiresAnnotation] != "2030-01-01T00:00:00Z" {
		t.Errorf("user secret during a rotation = %+v", us)
	}
	us.Annotations[RotateAnnotation] = "2"
	if got, rotate, err := UserCredentialsFrom(us); err != nil || got != uc || rotate != "2" {
		t.Errorf("UserCredentialsFrom during a rotation = %+v, %q, %v", got, rotate, err)
	}
	us.Data[UserPasswordKey] = []byte("short")
	if _, _, err := UserCredentialsFrom(us); err == nil || !strings.Contains(err.Error(), `key "password"`) {
		t.Errorf("UserCredentialsFrom with a short password: %v, want an error naming the key", err)
	}
	cm := DesiredConfigMap(cs, "ns")
	if cm.Labels[LabelManagedBy] != ManagedByValue {
		t.Error("the ConfigMap lacks the managed-by label the manager's cache filters on")
	}
}

func pod(name, ip, node string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{PodIP: ip},
	}
}

func TestMembers(t *testing.T) {
	t.Parallel()
	pods := []corev1.Pod{
		pod("counterstore-x-2", "10.0.0.2", "n2"),
		pod("counterstore-x-0", "10.0.0.1", "n1"),
		pod("counterstore-x-1", "", ""), // scheduled, no IP yet
		pod("counterstore-x-7", "fd00::7", "n3"),
		pod("counterstore-x-01", "10.9.9.9", ""), // not an ordinal
		pod("counterstore-xy-3", "10.9.9.8", ""), // another store
	}
	got := Members(pods, "counterstore-x", 4, 4)
	want := []formation.Member{
		{Name: "counterstore-x-0", Addr: "10.0.0.1:6379", Host: "n1"},
		{Name: "counterstore-x-1"},
		{Name: "counterstore-x-2", Addr: "10.0.0.2:6379", Host: "n2"},
		{Name: "counterstore-x-3"},
		{Name: "counterstore-x-4", Leaving: true},
		{Name: "counterstore-x-5", Leaving: true},
		{Name: "counterstore-x-6", Leaving: true},
		{Name: "counterstore-x-7", Addr: "[fd00::7]:6379", Host: "n3", Leaving: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Members =\n%+v\nwant\n%+v", got, want)
	}
	// Shrinking: the StatefulSet still has 8, the spec wants 6.
	got = Members(nil, "counterstore-x", 6, 8)
	if len(got) != 8 || got[5].Leaving || !got[6].Leaving || !got[7].Leaving {
		t.Errorf("Members while shrinking = %+v", got)
	}
}

func TestValidatePassword(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{strings.Repeat("a", 16), "Zx9!#$%&()*+,-./:;<=>?@[]^_{|}~'", strings.Repeat("f", 512)} {
		if err := ValidatePassword(ok); err != nil {
			t.Errorf("ValidatePassword(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"short", strings.Repeat("a", 513), "has space in it!!", `has"quote"in-it`, `back\slash-in-it`, "tab\tin-the-middle", "non-ascii-é-pass"} {
		if err := ValidatePassword(bad); err == nil {
			t.Errorf("ValidatePassword(%q) = nil, want an error", bad)
		}
	}
}

func TestValidateManaged(t *testing.T) {
	t.Parallel()
	cs := testStore()
	if err := validateManaged(cs); err != nil {
		t.Fatalf("valid store: %v", err)
	}
	cs.Name = strings.Repeat("n", 40)
	cs.Spec.Managed.Shards = 0
	cs.Spec.Managed.ReplicasPerShard = 6
	cs.Spec.Managed.NodeTimeout = &metav1.Duration{Duration: 100 * time.Millisecond}
	err := validateManaged(cs)
	for _, field := range []string{"metadata.name", "spec.managed.shards", "spec.managed.replicasPerShard", "spec.managed.nodeTimeout"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("validateManaged error %v does not name %s", err, field)
		}
	}
}

func TestOptions(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.Namespace != DefaultNamespace || o.ResyncPeriod != 10*time.Second || o.ProgressPeriod <= 0 || o.MigrateBudget <= 0 || o.DialTimeout <= 0 {
		t.Errorf("defaults = %+v", o)
	}
	err := Options{Namespace: "Bad_NS", ResyncPeriod: -1, DialTimeout: -1}.Validate()
	for _, want := range []string{"namespace", "resyncPeriod", "dialTimeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %v does not name %s", err, want)
		}
	}
}

func TestConditions(t *testing.T) {
	t.Parallel()
	ready := formation.Health{Assigned: 16384, SlotsCovered: 16384, StateOK: true, Primaries: 3, Replicas: 3}
	tests := []struct {
		name                 string
		obs                  *observation
		err                  error
		ready, degraded      metav1.ConditionStatus
		readyReason, degrRsn string
		contains             string
	}{
		{"healthy", &observation{snapshot: &formation.Snapshot{}, health: ready, pass: &formation.Pass{Step: formation.StepDone}},
			nil, metav1.ConditionTrue, metav1.ConditionFalse, ReasonClusterReady, ReasonFullyRedundant, ""},
		{"replica missing", &observation{snapshot: &formation.Snapshot{}, health: func() formation.Health {
			h := ready
			h.MissingReplicas, h.Unreachable = 1, []string{"counterstore-x-4"}
			return h
		}(), pass: &formation.Pass{Waiting: []string{"1 replicas missing; waiting for more nodes"}}},
			nil, metav1.ConditionTrue, metav1.ConditionTrue, ReasonClusterReady, ReasonRedundancyLost, "counterstore-x-4"},
		{"forming", &observation{snapshot: &formation.Snapshot{Nodes: make([]formation.NodeState, 1)}, health: formation.Health{},
			pass: &formation.Pass{Step: formation.StepJoin, Waiting: []string{"a does not know b yet"}}},
			nil, metav1.ConditionFalse, metav1.ConditionUnknown, ReasonForming, ReasonNotReady, "a does not know b yet"},
		{"lost shard", &observation{snapshot: &formation.Snapshot{Nodes: make([]formation.NodeState, 3)},
			health: formation.Health{Assigned: 16384, SlotsCovered: 10000, Primaries: 2, StateOK: true}, pass: &formation.Pass{}},
			nil, metav1.ConditionFalse, metav1.ConditionUnknown, ReasonSlotsUncovered, ReasonNotReady, "10000 of 16384"},
		{"nothing reachable", &observation{snapshot: &formation.Snapshot{Nodes: []formation.NodeState{{Err: errors.New("refused")}}},
			health: formation.Health{Unreachable: []string{"x"}}, pass: &formation.Pass{}},
			nil, metav1.ConditionFalse, metav1.ConditionUnknown, ReasonUnreachable, ReasonNotReady, "refused"},
		{"secret", &observation{failReason: ReasonSecretError, failMessage: "no key"},
			nil, metav1.ConditionFalse, metav1.ConditionUnknown, ReasonSecretError, ReasonNotReady, "no key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, d := conditions(tt.obs, tt.err)
			if r.Status != tt.ready || r.Reason != tt.readyReason || d.Status != tt.degraded || d.Reason != tt.degrRsn {
				t.Errorf("conditions = Ready %s/%s (%s), Degraded %s/%s (%s); want Ready %s/%s, Degraded %s/%s",
					r.Status, r.Reason, r.Message, d.Status, d.Reason, d.Message, tt.ready, tt.readyReason, tt.degraded, tt.degrRsn)
			}
			if tt.contains != "" && !strings.Contains(r.Message+d.Message, tt.contains) {
				t.Errorf("messages %q / %q lack %q", r.Message, d.Message, tt.contains)
			}
			if r.Status == metav1.ConditionTrue && strings.Contains(r.Message, "waiting") {
				t.Errorf("a True Ready carries a progress note: %q", r.Message)
			}
		})
	}
}

// TestStartScript runs the container's start script with a real
// redis-server, as the kubelet would: it must serve on the Pod IP with the
// password, announce the Pod IP, take the config file, and come back as a
// new node after a restart.
func TestStartScript(t *testing.T) {
	t.Parallel()
	if _, err := redistest.FindServer(); err != nil {
		t.Fatal(err)
	}
	host := redistest.ClaimHost(t, RedisPort)
	dir := t.TempDir()
	confDir, dataDir := filepath.Join(dir, "config"), filepath.Join(dir, "data")
	for _, d := range []string{confDir, dataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := strings.ReplaceAll(RedisConf(testStore()), " /data", " "+dataDir)
	if err := os.WriteFile(filepath.Join(confDir, "redis.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	const password = "start-script-password-1"
	env := []string{"POD_IP=" + host.IP, "REDIS_PASSWORD=" + password, "REDISCLI_AUTH=" + password}
	start := func() string {
		t.Helper()
		p := redistest.StartServer(t, redistest.ServerOptions{
			Host: host.IP, Port: RedisPort, Password: password,
			Command: []string{"sh", "-c", StartScript(confDir, dataDir)}, Env: env,
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		got, err := p.Client().ConfigGet(ctx, "cluster-announce-ip").Result()
		if err != nil || got["cluster-announce-ip"] != host.IP {
			t.Errorf("cluster-announce-ip = %v, %v; want %s", got, err, host.IP)
		}
		got, err = p.Client().ConfigGet(ctx, "cluster-node-timeout").Result()
		if err != nil || got["cluster-node-timeout"] != "2000" {
			t.Errorf("cluster-node-timeout = %v, %v; want the config file's 2000", got, err)
		}
		id, err := p.Client().ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// A node of its own, unformed, is not Ready; once it serves every
		// slot it is.
		if err := probe(t, ReadinessScript, env); err == nil {
			t.Error("readiness probe passed on an unformed node")
		}
		if err := probe(t, LivenessScript, env); err != nil {
			t.Errorf("liveness probe failed on a running node: %v", err)
		}
		if err := p.Client().Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := probe(t, ReadinessScript, env)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("readiness probe still fails on a master serving every slot: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		p.Kill()
		return id
	}
	first, second := start(), start()
	if first == second {
		t.Errorf("the node kept its ID %s across a restart; the start script must drop nodes.conf", first)
	}
}

// probe runs a probe script as the kubelet's exec probe would, with the
// container's env.
func probe(t *testing.T, script string, env []string) error {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

func TestDesiredNetworkPolicy(t *testing.T) {
	t.Parallel()
	cs := testStore()
	np := DesiredNetworkPolicy(cs, "floodgate-system", []string{"shop", "billing", "shop"})
	if np.Name != "counterstore-orders" || np.Namespace != "floodgate-system" || len(np.OwnerReferences) != 1 {
		t.Errorf("metadata = %+v", np.ObjectMeta)
	}
	if !maps.Equal(np.Spec.PodSelector.MatchLabels, SelectorLabels("orders")) {
		t.Errorf("it selects %v, not the store's Pods", np.Spec.PodSelector.MatchLabels)
	}
	if got := fmt.Sprint(np.Spec.PolicyTypes); got != "[Ingress]" {
		t.Errorf("policy types %s, want ingress only", got)
	}
	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("%d ingress rules, want 2", len(np.Spec.Ingress))
	}
	clients, peers := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if len(clients.Ports) != 1 || clients.Ports[0].Port.IntValue() != RedisPort || len(clients.From) != 2 {
		t.Fatalf("clients rule %+v, want two peers on the Redis port only", clients)
	}
	sidecars, manager := clients.From[0], clients.From[1]
	// The injected label alone would admit a pod of any namespace that
	// asks for injection; the namespaces are named by the label the API
	// server sets, sorted and once each.
	wantNamespaces := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{"billing", "shop"},
	}}}
	if !reflect.DeepEqual(sidecars.NamespaceSelector, wantNamespaces) || sidecars.IPBlock != nil ||
		!reflect.DeepEqual(sidecars.PodSelector, &metav1.LabelSelector{MatchLabels: map[string]string{injection.LabelInjected: "true"}}) {
		t.Errorf("sidecar peer %+v, want the injected label in namespaces billing and shop only", sidecars)
	}
	if manager.NamespaceSelector != nil || !maps.Equal(manager.PodSelector.MatchLabels, map[string]string{StoreClientLabel: "true"}) {
		t.Errorf("manager peer %+v, want the store-client label in the store's namespace", manager)
	}
	if len(peers.Ports) != 2 || peers.Ports[0].Port.IntValue() != RedisPort || peers.Ports[1].Port.IntValue() != BusPort ||
		len(peers.From) != 1 || !maps.Equal(peers.From[0].PodSelector.MatchLabels, SelectorLabels("orders")) {
		t.Errorf("store peers rule %+v, want the store's Pods on the Redis and bus ports", peers)
	}

	// No namespace uses the store: no sidecar may reach it (an In with
	// no values is invalid, and an empty selector would admit them all).
	np = DesiredNetworkPolicy(cs, "floodgate-system", nil)
	if from := np.Spec.Ingress[0].From; len(from) != 1 || from[0].NamespaceSelector != nil ||
		!maps.Equal(from[0].PodSelector.MatchLabels, map[string]string{StoreClientLabel: "true"}) {
		t.Errorf("with no namespace served, the clients are %+v, want the manager's Pods only", from)
	}

	if !NetworkPolicyEnabled(cs.Spec.Managed) {
		t.Error("the NetworkPolicy is not on by default")
	}
	cs.Spec.Managed.NetworkPolicy = v1alpha1.NetworkPolicyDisabled
	if NetworkPolicyEnabled(cs.Spec.Managed) {
		t.Error("Disabled leaves the NetworkPolicy on")
	}
}

// policiesConfigMap is a namespace's policies ConfigMap as the policy
// controller writes it, naming store.
func policiesConfigMap(ns, store string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: config.ConfigMapName, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
		Data: map[string]string{config.DataKey: fmt.Sprintf(`{"apiVersion":%q,"revision":"r1","store":{"name":%q,"type":"redis",`+
			`"addresses":["10.0.0.1:6379"],"authSecretName":"floodgate-store-auth"},"policies":[]}`, config.APIVersion, store)},
	}
}

func TestStoreOf(t *testing.T) {
	t.Parallel()
	memory := policiesConfigMap("shop", "orders")
	memory.Data[config.DataKey] = `{"apiVersion":"v","store":{"type":"memory"},"policies":[]}`
	unlabelled := policiesConfigMap("shop", "orders")
	unlabelled.Labels = nil
	other := policiesConfigMap("shop", "orders")
	other.Name = config.RateLimitServiceConfigMapName
	broken := policiesConfigMap("shop", "orders")
	broken.Data[config.DataKey] = "{"
	for _, tc := range []struct {
		name string
		obj  client.Object
		want string
	}{
		{"the policy controller's ConfigMap", policiesConfigMap("shop", "orders"), "orders"},
		{"a memory store", memory, ""},
		// The policy controller repairs only what it labels: a look-alike
		// it does not see must not open the store to a namespace.
		{"not labelled by the policy controller", unlabelled, ""},
		{"another ConfigMap", other, ""},
		{"an unreadable document", broken, ""},
		{"not a ConfigMap", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName}}, ""},
	} {
		if got := storeOf(tc.obj); got != tc.want {
			t.Errorf("%s: storeOf = %q, want %q", tc.name, got, tc.want)
		}
	}

	p := servedChanged()
	if !p.Update(event.UpdateEvent{ObjectOld: policiesConfigMap("shop", "orders"), ObjectNew: policiesConfigMap("shop", "default")}) {
		t.Error("a namespace moving to another store is not passed on")
	}
	if p.Update(event.UpdateEvent{ObjectOld: policiesConfigMap("shop", "orders"), ObjectNew: policiesConfigMap("shop", "orders")}) {
		t.Error("a document change that keeps the store is passed on: it would cost a formation pass")
	}
	if !p.Create(event.CreateEvent{Object: policiesConfigMap("shop", "orders")}) || !p.Delete(event.DeleteEvent{Object: policiesConfigMap("shop", "orders")}) {
		t.Error("a namespace that starts or stops using a store is not passed on")
	}
	if p.Create(event.CreateEvent{Object: unlabelled}) {
		t.Error("a ConfigMap that names no store is passed on")
	}
}
