package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Concurrency caps the requests of one key that are in flight at once, over
// every replica of the selected pods. A request holds a slot from its
// admission until its response body is complete, its client goes away or
// its stream (a WebSocket, a gRPC stream) ends; a request that finds every
// slot taken is answered 429.
type Concurrency struct {
	// Max is the most requests of one key in flight at once, over all the
	// replicas together.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Max int64 `json:"max"`

	// LeaseTTL is how long a slot stays taken after the sidecar that holds
	// it stops renewing it: a sidecar that crashes mid-request gives its
	// slots back after at most this long. A sidecar renews the slots of a
	// long request (a stream) every third of it. Between 1s and 10m; 10s
	// when unset.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('10m'))",message="must be between 1s and 10m"
	LeaseTTL *metav1.Duration `json:"leaseTTL,omitempty"`
}

// Priority is a request class of the load shedder, from the most to the
// least important: Critical, Default, Sheddable.
// +kubebuilder:validation:Enum=Critical;Default;Sheddable
type Priority string

// The Priority values.
const (
	PriorityCritical  Priority = "Critical"
	PriorityDefault   Priority = "Default"
	PrioritySheddable Priority = "Sheddable"
)

// LoadShedding configures the priority load shedder of each selected pod's
// sidecar. The sidecar measures the application from the requests it
// forwards (the requests in flight and their latency against a baseline it
// learns) and adapts a limit on the requests in flight to it. Past the
// limit it answers 503 with Retry-After, lowest priority first: a Critical
// request is never shed while a Default or Sheddable one would be admitted,
// nor a Default one while a Sheddable one would.
//
// +kubebuilder:validation:XValidation:rule="!has(self.minLimit) || !has(self.maxLimit) || self.minLimit <= self.maxLimit",message="minLimit must not exceed maxLimit",fieldPath=".minLimit"
type LoadShedding struct {
	// Mode is Enforce, or Shadow to learn the limit and count what would
	// be shed without shedding anything.
	// +optional
	// +kubebuilder:default=Enforce
	Mode Mode `json:"mode,omitempty"`

	// Reserved holds back shares of the limit for the higher priorities.
	// +optional
	Reserved *ReservedShares `json:"reserved,omitempty"`

	// MinLimit is the least the adaptive limit on requests in flight to
	// one pod's application may fall to. 4 when unset.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	MinLimit int32 `json:"minLimit,omitempty"`

	// MaxLimit is the most the adaptive limit may grow to. 1000 when
	// unset.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	MaxLimit int32 `json:"maxLimit,omitempty"`
}

// ReservedShares are percentages of the adaptive limit that lower
// priorities may not use.
//
// +kubebuilder:validation:XValidation:rule="(has(self.critical) ? self.critical : 20) + (has(self.default) ? self.default : 10) <= 90",message="critical and default together must reserve at most 90 percent, so that Sheddable requests keep a share"
type ReservedShares struct {
	// Critical is the percentage of the limit that only Critical requests
	// may use: Default and Sheddable requests are shed once the requests
	// in flight reach the rest. 20 when unset.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=90
	Critical *int32 `json:"critical,omitempty"`

	// Default is the further percentage that Default and Critical requests
	// may use and Sheddable ones may not. 10 when unset.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=90
	Default *int32 `json:"default,omitempty"`
}

// The bounds of the fields above come from the sidecar's config package,
// so that the API accepts what a sidecar loads; TestCRDMarkersHoldTheBounds
// holds the markers' literals to them.
const (
	maxConcurrency   = config.MaxConcurrency
	maxSheddingLimit = config.MaxSheddingLimit
	maxReserved      = config.MaxReserved
)
