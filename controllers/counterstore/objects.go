package counterstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// Names and labels of the objects a managed store owns.
const (
	// NamePrefix starts the name of every object of a managed store:
	// counterstore-<store>.
	NamePrefix = "counterstore-"
	// RedisPort is the node port; the cluster bus uses RedisPort+10000.
	RedisPort = 6379
	// BusPort is the cluster bus port.
	BusPort = RedisPort + 10000
	// PasswordKey is the key of the password in the auth Secret.
	PasswordKey = "password"

	// LabelName, LabelInstance, LabelComponent and LabelManagedBy are the
	// recommended labels on every object of a store. LabelName and
	// LabelInstance select the store's Pods.
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"

	// StoreClientLabel, set to "true", marks the manager's Pods as clients
	// of the managed stores: their NetworkPolicies admit those Pods of the
	// manager's namespace. The Helm chart sets it, on the manager's and the
	// central rate-limit service's Pods, and so does config/manager; the ValidatingAdmissionPolicy
	// floodgate-pod-labels refuses it on Pods of any other namespace, and
	// on a running Pod.
	StoreClientLabel = "ratelimit.floodgate.dev/store-client"
	// injectedLabel marks the Pods the injector gave a sidecar
	// (injection.LabelInjected): the stores' NetworkPolicies admit them
	// from the namespaces each store serves (DesiredNetworkPolicy).
	injectedLabel = "floodgate.dev/injected"

	// NameValue is LabelName's value.
	NameValue = "floodgate-counterstore"
	// ManagedByValue is LabelManagedBy's value; the manager's cache
	// watches only ConfigMaps that carry it.
	ManagedByValue = "floodgate-manager"

	// ConfigHashAnnotation on the Pod template holds a hash of redis.conf,
	// so that a config change rolls the Pods.
	ConfigHashAnnotation = "ratelimit.floodgate.dev/config-hash"
	// AuthHashAnnotation on the Pod template holds a hash of the admin
	// password, so that a new one rolls the Pods. The namespaces' users'
	// passwords change on the running nodes (ACL SETUSER), without a roll.
	AuthHashAnnotation = "ratelimit.floodgate.dev/auth-hash"

	// DefaultImage is the API's default spec.managed.image: floodgate's
	// Redis image, built by `make images` (hack/images).
	DefaultImage = "ghcr.io/floodgate-dev/floodgate-redis:0.1.0"

	configDir = "/etc/redis"
	dataDir   = "/data"
)

// ObjectName returns the name of the StatefulSet, the headless Service and
// the PodDisruptionBudget of store: counterstore-<store>.
func ObjectName(store string) string { return NamePrefix + store }

// ConfigMapName returns the name of store's redis.conf ConfigMap.
func ConfigMapName(store string) string { return NamePrefix + store + "-config" }

// AuthSecretName returns the name of store's credentials Secret, in the
// manager's namespace: the admin password. The sidecars get their
// namespace's user's password (UserSecretName) from their own namespace's
// copy, floodgate-store-auth (package sidecaraccess).
func AuthSecretName(store string) string { return NamePrefix + store + "-auth" }

// SelectorLabels returns the labels that select store's Pods.
func SelectorLabels(store string) map[string]string {
	return map[string]string{LabelName: NameValue, LabelInstance: store}
}

func labelsFor(store, component string) map[string]string {
	l := SelectorLabels(store)
	l[LabelComponent] = component
	l[LabelManagedBy] = ManagedByValue
	return l
}

// ownerRef returns the controller reference to cs.
func ownerRef(cs *v1alpha1.CounterStore) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.GroupVersion.String(),
		Kind:               "CounterStore",
		Name:               cs.Name,
		UID:                cs.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

func objectMeta(cs *v1alpha1.CounterStore, ns, name, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            name,
		Namespace:       ns,
		Labels:          labelsFor(cs.Name, component),
		OwnerReferences: []metav1.OwnerReference{ownerRef(cs)},
	}
}

// defaultNodeTimeout is the API's default for spec.managed.nodeTimeout.
const defaultNodeTimeout = 5 * time.Second

// nodeTimeout returns the managed store's cluster-node-timeout.
func nodeTimeout(m *v1alpha1.ManagedStore) time.Duration {
	if m.NodeTimeout != nil && m.NodeTimeout.Duration > 0 {
		return m.NodeTimeout.Duration
	}
	return defaultNodeTimeout
}

// TotalNodes returns the number of Redis nodes m asks for.
func TotalNodes(m *v1alpha1.ManagedStore) int {
	return int(m.Shards) * (1 + int(m.ReplicasPerShard))
}

// RedisConf returns the redis.conf of a managed store's nodes. The start
// script adds what differs per Pod or is secret: bind and
// cluster-announce-ip (the Pod IP), requirepass and masterauth.
//
// Nothing is persisted (no RDB, no AOF): counters are short-lived. Every
// slot that a live master serves keeps working while another shard is
// down (cluster-require-full-coverage no), so one lost shard fails only
// its own keys, which the sidecars handle by their rules' failure modes.
// A replica may always fail over however long it was cut off
// (cluster-replica-validity-factor 0): stale counters beat no counters.
// Replicas stay where the operator put them
// (cluster-allow-replica-migration no).
func RedisConf(cs *v1alpha1.CounterStore) string {
	m := cs.Spec.Managed
	var b strings.Builder
	fmt.Fprintf(&b, "# redis.conf of CounterStore %s, written by floodgate-manager: edits are overwritten.\n", cs.Name)
	lines := [][2]string{
		{"port", strconv.Itoa(RedisPort)},
		{"protected-mode", "yes"},
		{"daemonize", "no"},
		{"dir", dataDir},
		{"save", `""`},
		{"appendonly", "no"},
		{"cluster-enabled", "yes"},
		{"cluster-config-file", dataDir + "/nodes.conf"},
		{"cluster-node-timeout", strconv.FormatInt(nodeTimeout(m).Milliseconds(), 10)},
		{"cluster-require-full-coverage", "no"},
		{"cluster-replica-validity-factor", "0"},
		{"cluster-allow-replica-migration", "no"},
		{"tcp-keepalive", "60"},
	}
	if m.MaxMemory != nil && !m.MaxMemory.IsZero() {
		lines = append(lines, [2]string{"maxmemory", strconv.FormatInt(m.MaxMemory.Value(), 10)},
			[2]string{"maxmemory-policy", "volatile-ttl"})
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "%s %s\n", l[0], l[1])
	}
	return b.String()
}

// StartScript returns the Redis container's shell command. It drops
// nodes.conf, so a restarted node always joins as a new, empty node: an
// empty node that kept its identity would come back as the master of its
// old slots, and its replica would then copy the empty data set. A new node
// leaves the old identity to fail over to its replica, and the operator
// makes the new node a replica. The per-Pod settings and the admin
// password go in through standard input, never on the command line. The
// namespaces' users and the counter functions are not there: the manager
// sets them on the running nodes (ACL SETUSER, FUNCTION LOAD) before a new
// node serves any slot.
func StartScript(confDir, dir string) string {
	return fmt.Sprintf(`set -eu
rm -f %[2]s/nodes.conf
exec redis-server %[1]s/redis.conf - <<EOF
bind ${POD_IP}
cluster-announce-ip ${POD_IP}
requirepass "${REDIS_PASSWORD}"
masterauth "${REDIS_PASSWORD}"
EOF
`, confDir, dir)
}

// LivenessScript checks that the node answers PING. REDISCLI_AUTH carries
// the password.
const LivenessScript = `redis-cli -h "${POD_IP}" -p 6379 ping | grep -q PONG`

// ReadinessScript checks that the node serves its role: it sees the
// cluster as ok, and it is either a replica whose link to its master is
// up, or a master that serves slots. A new node is therefore not Ready
// until the operator has made it a replica and it has synced, so a rolling
// update never restarts a shard's last copy before its new replica holds
// the data. The Pods' Service publishes not-ready addresses, and the
// operator dials Pods by IP, so formation does not wait for readiness.
const ReadinessScript = `set -eu
cli() { redis-cli -h "${POD_IP}" -p 6379 "$@"; }
case "$(cli cluster info)" in *cluster_state:ok*) ;; *) exit 1 ;; esac
repl=$(cli info replication)
case "$repl" in
*role:slave*) case "$repl" in *master_link_status:up*) exit 0 ;; esac; exit 1 ;;
esac
cli cluster nodes | awk '$3 ~ /myself/ { found = 1; if (NF > 8) ok = 1 } END { exit !(found && ok) }'
`

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// DesiredConfigMap returns the ConfigMap holding redis.conf.
func DesiredConfigMap(cs *v1alpha1.CounterStore, ns string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: objectMeta(cs, ns, ConfigMapName(cs.Name), "redis"),
		Data:       map[string]string{"redis.conf": RedisConf(cs)},
	}
}

// DesiredService returns the headless Service that gives the Pods their
// DNS names. It publishes not-ready addresses: nodes must find each other
// before the cluster can serve.
func DesiredService(cs *v1alpha1.CounterStore, ns string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(cs, ns, ObjectName(cs.Name), "redis"),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 SelectorLabels(cs.Name),
			PublishNotReadyAddresses: true,
			Ports: []corev1.ServicePort{
				{Name: "redis", Port: RedisPort, TargetPort: intstr.FromString("redis"), Protocol: corev1.ProtocolTCP},
				{Name: "bus", Port: BusPort, TargetPort: intstr.FromString("bus"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// DesiredNetworkPolicy returns the NetworkPolicy that lets only the
// store's clients reach its Pods: on the Redis port, the injected sidecars
// of sidecarNamespaces and the manager's Pods; on the Redis port and the
// cluster bus, the store's own Pods (replication, slot migration).
// Ingress only: what the Redis Pods reach is not restricted.
//
// A sidecar is a Pod labelled injectedLabel in one of sidecarNamespaces:
// the namespaces whose policies document ("floodgate-policies", package
// policy) names this store, which are those its sidecars connect to and
// into which package sidecaraccess mirrors its credentials (ServedNamespaces
// lists them). Neither half is enough alone. The label is set by the
// injector and kept to the pods it injects by the ValidatingAdmissionPolicy
// floodgate-pod-labels, but any namespace's pods may ask for injection; the
// namespaces are named by kubernetes.io/metadata.name, which the API
// server sets and nobody can change, and not by a label of floodgate's on
// the Namespace, which would need the manager to write every Namespace and
// a namespace's admins not to. A namespace whose pods use another store,
// or no policy at all, does not reach this one even with injected pods.
// With no such namespace, no sidecar peer is listed.
//
// Manager Pods are those labelled StoreClientLabel in ns, the store's own
// namespace (the manager's): the manager and the central rate-limit
// service, whose document may name any store.
func DesiredNetworkPolicy(cs *v1alpha1.CounterStore, ns string, sidecarNamespaces []string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := func(p int) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(int32(p)))}
	}
	var clients []networkingv1.NetworkPolicyPeer
	if names := slices.Compact(slices.Sorted(slices.Values(sidecarNamespaces))); len(names) > 0 {
		clients = append(clients, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: names,
			}}},
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{injectedLabel: "true"}},
		})
	}
	clients = append(clients, networkingv1.NetworkPolicyPeer{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{StoreClientLabel: "true"}},
	})
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: objectMeta(cs, ns, ObjectName(cs.Name), "redis"),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: SelectorLabels(cs.Name)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  clients,
				Ports: []networkingv1.NetworkPolicyPort{port(RedisPort)},
			}, {
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: SelectorLabels(cs.Name)}}},
				Ports: []networkingv1.NetworkPolicyPort{port(RedisPort), port(BusPort)},
			}},
		},
	}
}

// NetworkPolicyEnabled reports whether a managed store keeps its
// NetworkPolicy (the default).
func NetworkPolicyEnabled(m *v1alpha1.ManagedStore) bool {
	return m.NetworkPolicy != v1alpha1.NetworkPolicyDisabled
}

// DesiredPDB returns the PodDisruptionBudget that lets voluntary
// disruptions take one node at a time, so a shard never loses its master
// and its replica together to a drain.
func DesiredPDB(cs *v1alpha1.CounterStore, ns string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: objectMeta(cs, ns, ObjectName(cs.Name), "redis"),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: SelectorLabels(cs.Name)},
		},
	}
}

// DesiredSecret returns the Secret that holds the store's admin password.
func DesiredSecret(cs *v1alpha1.CounterStore, ns string, c Credentials) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: objectMeta(cs, ns, AuthSecretName(cs.Name), "auth"),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{PasswordKey: []byte(c.Admin)},
	}
}

// Credentials are a managed store's admin password, as its auth Secret
// holds it.
type Credentials struct {
	// Admin is the default user's password (PasswordKey).
	Admin string
}

// CredentialsFrom reads the admin password a managed store's auth Secret
// holds.
func CredentialsFrom(s *corev1.Secret) (Credentials, error) {
	c := Credentials{Admin: string(s.Data[PasswordKey])}
	if c.Admin != "" {
		if err := ValidatePassword(c.Admin); err != nil {
			return Credentials{}, fmt.Errorf("key %q: %w", PasswordKey, err)
		}
	}
	return c, nil
}

// UserSecretName returns the name of the Secret, in the manager's
// namespace, that holds namespace ns's store user's passwords for store:
// counterstore-<store>-user- and a hash of ns, so that any namespace name
// fits and no two collide. Its labels name the store and the namespace.
func UserSecretName(store, ns string) string {
	sum := sha256.Sum256([]byte(ns))
	return NamePrefix + store + "-user-" + hex.EncodeToString(sum[:8])
}

// UserSecretLabels are the labels of namespace ns's user Secret of store.
func UserSecretLabels(store, ns string) map[string]string {
	l := labelsFor(store, "store-user")
	l[UserStoreLabel] = store
	l[UserNamespaceLabel] = ns
	return l
}

// NewUserSecret returns the Secret that asks for namespace ns's store user
// of cs, as the sidecaraccess controller creates it: no password yet, which
// the store's controller generates once every node accepts it. The
// CounterStore owns it, so its controller hears of it.
func NewUserSecret(cs *v1alpha1.CounterStore, managerNS, ns string) *corev1.Secret {
	meta := objectMeta(cs, managerNS, UserSecretName(cs.Name, ns), "store-user")
	meta.Labels = UserSecretLabels(cs.Name, ns)
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: meta,
		Type:       corev1.SecretTypeOpaque,
	}
}

// DesiredUserSecret returns namespace ns's user Secret of cs holding c:
// the password, and during a rotation the previous one with its expiry.
func DesiredUserSecret(cs *v1alpha1.CounterStore, managerNS, ns string, c UserCredentials) *corev1.Secret {
	s := NewUserSecret(cs, managerNS, ns)
	s.Data = map[string][]byte{UserPasswordKey: []byte(c.Password)}
	s.Annotations = map[string]string{}
	if c.Rotated != "" {
		s.Annotations[RotatedAnnotation] = c.Rotated
	}
	if c.Previous != "" {
		s.Data[PreviousUserPasswordKey] = []byte(c.Previous)
		s.Annotations[PreviousExpiresAnnotation] = c.PreviousExpires.UTC().Format(time.RFC3339)
	}
	return s
}

// UserCredentialsFrom reads the credentials a namespace user's Secret
// holds, and the RotateAnnotation value it asks for.
func UserCredentialsFrom(s *corev1.Secret) (c UserCredentials, rotate string, err error) {
	c = UserCredentials{
		Password: string(s.Data[UserPasswordKey]),
		Previous: string(s.Data[PreviousUserPasswordKey]),
		Rotated:  s.Annotations[RotatedAnnotation],
	}
	if c.Previous != "" {
		expires, perr := time.Parse(time.RFC3339, s.Annotations[PreviousExpiresAnnotation])
		if perr != nil {
			// Unreadable: drop the previous password at once.
			c.Previous = ""
		} else {
			c.PreviousExpires = expires
		}
	}
	for _, kv := range [][2]string{{UserPasswordKey, c.Password}, {PreviousUserPasswordKey, c.Previous}} {
		if kv[1] == "" {
			continue
		}
		if err := ValidatePassword(kv[1]); err != nil {
			return UserCredentials{}, "", fmt.Errorf("key %q: %w", kv[0], err)
		}
	}
	return c, s.Annotations[RotateAnnotation], nil
}

// DesiredStatefulSet returns the StatefulSet of the store's Redis nodes,
// with the given number of replicas (the controller keeps leaving nodes
// until they are drained).
func DesiredStatefulSet(cs *v1alpha1.CounterStore, ns string, replicas int32, password string) *appsv1.StatefulSet {
	m := cs.Spec.Managed
	name := ObjectName(cs.Name)
	podLabels := labelsFor(cs.Name, "redis")
	image := m.Image
	if image == "" {
		image = DefaultImage
	}
	probe := func(script string, period, failures, initial int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", script}}},
			InitialDelaySeconds: initial,
			PeriodSeconds:       period,
			TimeoutSeconds:      2,
			FailureThreshold:    failures,
		}
	}
	secretRef := func(key string, optional bool) *corev1.EnvVarSource {
		ref := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: AuthSecretName(cs.Name)},
			Key:                  key,
		}}
		if optional {
			ref.SecretKeyRef.Optional = ptr.To(true)
		}
		return ref
	}
	passwordRef := secretRef(PasswordKey, false)
	container := corev1.Container{
		Name:            "redis",
		Image:           image,
		ImagePullPolicy: m.ImagePullPolicy,
		Command:         []string{"sh", "-c", StartScript(configDir, dataDir)},
		Env: []corev1.EnvVar{
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "REDIS_PASSWORD", ValueFrom: passwordRef},
			{Name: "REDISCLI_AUTH", ValueFrom: passwordRef},
		},
		Ports: []corev1.ContainerPort{
			{Name: "redis", ContainerPort: RedisPort, Protocol: corev1.ProtocolTCP},
			{Name: "bus", ContainerPort: BusPort, Protocol: corev1.ProtocolTCP},
		},
		ReadinessProbe: probe(ReadinessScript, 5, 2, 2),
		LivenessProbe:  probe(LivenessScript, 10, 6, 15),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "data", MountPath: dataDir},
			{Name: "config", MountPath: configDir, ReadOnly: true},
		},
	}
	if m.Resources != nil {
		container.Resources = *m.Resources.DeepCopy()
	}
	pod := corev1.PodSpec{
		Containers:                    []corev1.Container{container},
		EnableServiceLinks:            ptr.To(false),
		AutomountServiceAccountToken:  ptr.To(false),
		TerminationGracePeriodSeconds: ptr.To[int64](10),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			RunAsUser:      ptr.To[int64](999), // the redis user of floodgate's and the official image
			RunAsGroup:     ptr.To[int64](999),
			FSGroup:        ptr.To[int64](999),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		NodeSelector:      maps.Clone(m.NodeSelector),
		PriorityClassName: m.PriorityClassName,
		Affinity:          antiAffinity(m.PodAntiAffinity, SelectorLabels(cs.Name)),
		Volumes: []corev1.Volume{
			{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(cs.Name)},
			}}},
		},
	}
	for _, t := range m.Tolerations {
		pod.Tolerations = append(pod.Tolerations, *t.DeepCopy())
	}
	return &appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: objectMeta(cs, ns, name, "redis"),
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(replicas),
			ServiceName: name,
			Selector:    &metav1.LabelSelector{MatchLabels: SelectorLabels(cs.Name)},
			// The operator, not the ordinal order, decides roles: start
			// every Pod at once.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: podLabels,
					Annotations: map[string]string{
						ConfigHashAnnotation: hash(RedisConf(cs)),
						AuthHashAnnotation:   hash(password),
					},
				},
				Spec: pod,
			},
		},
	}
}

// antiAffinity spreads the store's Pods over Kubernetes nodes.
func antiAffinity(mode v1alpha1.AntiAffinityMode, selector map[string]string) *corev1.Affinity {
	term := corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: selector},
		TopologyKey:   corev1.LabelHostname,
	}
	switch mode {
	case v1alpha1.AntiAffinityNone:
		return nil
	case v1alpha1.AntiAffinityRequired:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
		}}
	default:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: term}},
		}}
	}
}
