package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RedisClusterSlots is the number of hash slots of a Redis Cluster.
const RedisClusterSlots = 16384

// CounterStoreSpec says where the shared counts live: a Redis Cluster that
// floodgate-manager runs (Managed) or one that exists already (External).
//
// +kubebuilder:validation:XValidation:rule="has(self.managed) != has(self.external)",message="set exactly one of managed or external"
type CounterStoreSpec struct {
	// Managed asks floodgate-manager to run a Redis Cluster.
	// +optional
	Managed *ManagedStore `json:"managed,omitempty"`

	// External points at an existing Redis Cluster.
	// +optional
	External *ExternalStore `json:"external,omitempty"`
}

// ManagedStore is a Redis Cluster run by floodgate-manager: a StatefulSet
// of Shards*(1+ReplicasPerShard) nodes, a headless Service, a ConfigMap
// with redis.conf, a PodDisruptionBudget and a Secret with a generated
// password, all in the manager's namespace and named
// counterstore-<name>[-suffix], formed into a cluster over the Redis
// protocol. Nothing is persisted: counters are short-lived, and a node
// that restarts joins as a new, empty node while its replica takes over.
// Changing Shards migrates slots, keys included; the StatefulSet shrinks
// only after the leaving nodes hold no slot.
type ManagedStore struct {
	// Shards is the number of primaries. The 16384 hash slots are split
	// evenly between them.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	Shards int32 `json:"shards,omitempty"`

	// ReplicasPerShard is the number of replicas of each primary. A
	// replica is promoted when its primary has been unreachable for
	// NodeTimeout.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=5
	ReplicasPerShard int32 `json:"replicasPerShard"`

	// Image is the Redis server image: Redis 7.0 or later, with sh,
	// redis-cli, rm, grep and awk on its PATH (the start script and the
	// probes run them), run as uid 999. The default is floodgate's Redis
	// image, which `make images` builds from Debian's redis-server and
	// which a release publishes with the chart's appVersion as its tag.
	// +optional
	// +kubebuilder:default="ghcr.io/floodgate-dev/floodgate-redis:0.1.0"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// ImagePullPolicy is the pull policy of the Redis containers.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources are the compute resources of each Redis container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// MaxMemory caps each node's memory for counters (Redis maxmemory).
	// Counters all carry a TTL, so the node evicts those nearest expiry
	// first (volatile-ttl). When unset, Redis has no cap.
	// +optional
	MaxMemory *resource.Quantity `json:"maxMemory,omitempty"`

	// NodeTimeout is the Redis cluster-node-timeout: how long a node may be
	// unreachable before it is considered failed, between 1s and 60s.
	// +optional
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('60s'))",message="must be between 1s and 60s"
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`

	// PodAntiAffinity spreads the store's Pods over Kubernetes nodes
	// (topology key kubernetes.io/hostname): Preferred (default) asks the
	// scheduler to, Required refuses to schedule two of them on one node
	// (so the cluster needs as many Kubernetes nodes as Redis nodes), None
	// does nothing. Independently, each replica is attached to a master
	// on another Kubernetes node wherever the Pods' placement allows.
	// +optional
	// +kubebuilder:default=Preferred
	PodAntiAffinity AntiAffinityMode `json:"podAntiAffinity,omitempty"`

	// NodeSelector constrains the Redis pods to matching nodes.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations are the Redis pods' tolerations.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// PriorityClassName is the Redis pods' priority class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// NetworkPolicy, Enabled by default, makes the manager keep a
	// NetworkPolicy that lets only the injected sidecars of the namespaces
	// that use the store (pods labelled floodgate.dev/injected=true, in a
	// namespace whose compiled policies name this store; the list follows
	// the policies), the manager's pods (labelled
	// ratelimit.floodgate.dev/store-client=true in the manager's
	// namespace) and the store's own Pods reach the Redis Pods. It takes
	// effect only where the cluster's network plugin enforces
	// NetworkPolicies. Disabled removes it.
	// +optional
	// +kubebuilder:default=Enabled
	NetworkPolicy NetworkPolicyMode `json:"networkPolicy,omitempty"`
}

// NetworkPolicyMode turns a managed store's NetworkPolicy on or off.
// +kubebuilder:validation:Enum=Enabled;Disabled
type NetworkPolicyMode string

// The NetworkPolicyMode values.
const (
	NetworkPolicyEnabled  NetworkPolicyMode = "Enabled"
	NetworkPolicyDisabled NetworkPolicyMode = "Disabled"
)

// AntiAffinityMode says how strongly the nodes of a shard are spread.
// +kubebuilder:validation:Enum=Preferred;Required;None
type AntiAffinityMode string

// The AntiAffinityMode values.
const (
	AntiAffinityPreferred AntiAffinityMode = "Preferred"
	AntiAffinityRequired  AntiAffinityMode = "Required"
	AntiAffinityNone      AntiAffinityMode = "None"
)

// ExternalStore is a Redis Cluster that floodgate does not run.
type ExternalStore struct {
	// Addresses are seed nodes, host:port. The rest of the cluster is
	// discovered from them.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Addresses []HostPort `json:"addresses"`

	// PasswordSecretRef names the Secret key that holds the password
	// (Redis AUTH). When unset, no password is sent.
	// +optional
	PasswordSecretRef *SecretKeySelector `json:"passwordSecretRef,omitempty"`

	// TLS enables TLS to the cluster. When unset, connections are plain
	// TCP.
	// +optional
	TLS *StoreTLS `json:"tls,omitempty"`
}

// HostPort is a network address, host:port, with IPv6 hosts in brackets.
//
// +kubebuilder:validation:MinLength=3
// +kubebuilder:validation:MaxLength=261
// +kubebuilder:validation:Pattern=`^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$`
type HostPort string

// SecretKeySelector names one key of a Secret in a given namespace. A
// CounterStore is cluster-scoped, so its references carry a namespace.
type SecretKeySelector struct {
	// Namespace is the Secret's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// Name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// Key is the data key within the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// StoreTLS configures TLS to an external store.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.insecureSkipVerify) && self.insecureSkipVerify && has(self.caSecretRef))",message="caSecretRef has no effect with insecureSkipVerify: true; set one or the other"
type StoreTLS struct {
	// CASecretRef names the Secret key holding the PEM CA bundle that
	// verifies the store's certificates. When unset, the system roots are
	// used.
	// +optional
	CASecretRef *SecretKeySelector `json:"caSecretRef,omitempty"`

	// ServerName overrides the name checked in the store's certificates.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServerName string `json:"serverName,omitempty"`

	// InsecureSkipVerify disables certificate verification. For testing
	// only.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// CounterStoreStatus is the observed state of the store. The store
// controller publishes what sidecars need in Endpoints and AuthSecretName
// for managed and external stores alike, so consumers never look at the
// spec's variant.
type CounterStoreStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Ready and Degraded. Ready is True when the cluster
	// is formed, every hash slot is served by a reachable master, every
	// master reports cluster_state:ok, and Endpoints are published.
	// Degraded is True when the store is Ready but has lost redundancy: a
	// master short of replicas, a failed node, or a node the manager
	// cannot reach. Their messages say what the manager is doing or
	// waiting for.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// SlotsCovered is the number of the 16384 hash slots that a reachable
	// primary serves.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16384
	SlotsCovered int32 `json:"slotsCovered"`

	// Nodes counts the cluster's nodes by role.
	// +optional
	Nodes NodeCounts `json:"nodes,omitzero"`

	// Endpoints are the seed addresses, host:port, that sidecars connect
	// to: for a managed store, the addresses of the masters that serve
	// slots; for an external store, spec.external.addresses.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Endpoints []string `json:"endpoints,omitempty"`

	// AuthSecretName names the Secret, in each namespace whose policies
	// use the store, that holds the sidecars' credentials: the password
	// under the key "password" and, for a managed store, the namespace's
	// own restricted user under "username". The manager keeps that one copy per
	// namespace (floodgate-store-auth). Empty when the store takes no
	// password.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	AuthSecretName string `json:"authSecretName,omitempty"`
}

// NodeCounts counts Redis Cluster nodes by role.
type NodeCounts struct {
	// Primaries is the number of reachable primaries that serve slots.
	// +optional
	Primaries int32 `json:"primaries"`
	// Replicas is the number of reachable replicas in sync with their
	// primary (link up, initial sync done); a replica still copying its
	// primary's data does not count, and Degraded stays True meanwhile.
	// +optional
	Replicas int32 `json:"replicas"`
	// Failed is the number of nodes the cluster marks as failed.
	// +optional
	Failed int32 `json:"failed"`
}

// CounterStore is a Redis Cluster that holds the shared counts of the
// RateLimitPolicies that reference it. It is cluster-scoped: one store
// serves many namespaces, and a policy without a storeRef uses the store
// named "default". A managed store's name becomes part of its objects'
// names, so it must be a DNS label of at most 39 characters.
//
// +kubebuilder:validation:XValidation:rule="!has(self.spec.managed) || (size(self.metadata.name) <= 39 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",message="a managed CounterStore's name must be a DNS label (lower-case letters, digits and '-') of at most 39 characters: it names the StatefulSet counterstore-<name>"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cstore,categories=floodgate
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.spec.managed.shards`
// +kubebuilder:printcolumn:name="Slots",type=integer,JSONPath=`.status.slotsCovered`
// +kubebuilder:printcolumn:name="Primaries",type=integer,JSONPath=`.status.nodes.primaries`,priority=1
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.nodes.replicas`,priority=1
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.nodes.failed`,priority=1
// +kubebuilder:printcolumn:name="Endpoints",type=string,JSONPath=`.status.endpoints`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CounterStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired store.
	// +required
	Spec CounterStoreSpec `json:"spec"`

	// Status is the observed state.
	// +optional
	Status CounterStoreStatus `json:"status,omitempty"`
}

// CounterStoreList is a list of CounterStore.
//
// +kubebuilder:object:root=true
type CounterStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the stores.
	Items []CounterStore `json:"items"`
}
