package config

import "strings"

// The pod contract: what floodgate-manager's injection webhook writes into
// a pod and what floodgate-sidecar reads from it, and the pod condition
// through which the sidecar reports back. Both planes take these names from
// here, so the control plane depends on this package and not on the
// sidecar's runtime.

// ContainerName is the injected sidecar container's name.
const ContainerName = "floodgate-sidecar"

// ConditionPolicyLoaded is the pod condition the sidecar reports, and the
// readiness gate the injection webhook adds to every pod it injects. It is
// True while a policy document is in force, so that a pod joins its
// Services only once its sidecar enforces something, and never leaves them
// because a later document was rejected (the last good one stays in
// force).
//
// When the reason is ReasonLoaded, the message is exactly the revision in
// force: floodgate-manager compares it with the ConfigMap's revision to
// count the pods that enforce a policy (status.enforcingPods) and to set
// its Programmed condition.
//
// It is an untyped constant so that it converts to corev1.PodConditionType
// without this package importing the Kubernetes API.
//
// With ReasonPartiallyLoaded, the message is PartialMessage: the revision
// and the policies of it that this pod does not enforce.
const ConditionPolicyLoaded = "floodgate.dev/policy-loaded"

// Reasons of ConditionPolicyLoaded.
const (
	// ReasonLoaded (True): the latest document of the ConfigMap is in
	// force; the message is its revision.
	ReasonLoaded = "Loaded"
	// ReasonPartiallyLoaded (True): the latest document is in force but
	// some of its policies could not be compiled here (a key file missing,
	// for example) and are not enforced; the message is PartialMessage.
	ReasonPartiallyLoaded = "PartiallyLoaded"
	// ReasonRevisionRejected (True): the latest document was rejected and
	// an earlier revision stays in force.
	ReasonRevisionRejected = "RevisionRejected"
	// ReasonConfigMapDeleted (True): the ConfigMap was deleted; the
	// revision in force keeps running for the deletion grace period, in
	// case the ConfigMap is being recreated.
	ReasonConfigMapDeleted = "ConfigMapDeleted"
	// ReasonNoPolicies (True): the ConfigMap stayed deleted past the grace
	// period, so the sidecar enforces no policy and proxies every request.
	ReasonNoPolicies = "NoPolicies"
	// ReasonWaitingForConfigMap (False): no document has been in force
	// yet because the ConfigMap does not exist.
	ReasonWaitingForConfigMap = "WaitingForConfigMap"
	// ReasonRejected (False): the document was rejected and no earlier
	// one is in force.
	ReasonRejected = "Rejected"
)

// Files and environment variables of an injected sidecar.
const (
	// PodInfoDir is where the downward API volume is mounted.
	PodInfoDir = "/etc/floodgate/podinfo"
	// LabelsFile is the pod's labels, one key="value" per line, read with
	// --pod-labels-file.
	LabelsFile = PodInfoDir + "/labels"
	// StoreAuthSecret is the Secret, in the sidecar's namespace, that
	// holds the store credentials the sidecar uses; the manager keeps it.
	StoreAuthSecret = "floodgate-store-auth"
	// StoreAuthKey is the store password's key in its Secret.
	StoreAuthKey = "password"
	// StoreAuthDir is where the store password's Secret is mounted.
	StoreAuthDir = "/etc/floodgate/store-auth"
	// StoreAuthFile is the store password's file, read for every new Redis
	// connection through EnvRedisPasswordFile.
	StoreAuthFile = StoreAuthDir + "/" + StoreAuthKey
	// StateDir is where the injector mounts the sidecar's own emptyDir and
	// points --state-dir: the sidecar saves the config in force there and,
	// when its container restarts, enforces it until the API server
	// answers.
	StateDir = "/var/run/floodgate/state"
	// StoreAuthUserKey is the store user's key in the same Secret, when
	// the store has users (Redis ACLs): a managed store's sidecar user.
	// Without it the password is the default user's.
	StoreAuthUserKey = "username"
	// StoreAuthUserFile is the store user's file, read with the password
	// through EnvRedisUsernameFile. A missing file means the default user.
	StoreAuthUserFile = StoreAuthDir + "/" + StoreAuthUserKey
	// StoreCAKey is, in the same Secret, the PEM bundle that verifies an
	// external store's TLS certificates (its CounterStore's
	// tls.caSecretRef), when it names one.
	StoreCAKey = "ca.crt"
	// StoreCAFile is that bundle's file, the compiled config's
	// store.tls.caFile. The sidecar reads it for every new TLS connection,
	// so a bundle mirrored after the config, or rotated, is used without a
	// restart.
	StoreCAFile = StoreAuthDir + "/" + StoreCAKey

	// EnvKubernetes ("true") selects the sidecar's Kubernetes mode: the
	// ConfigMap watch and the pod condition.
	EnvKubernetes = "FLOODGATE_KUBERNETES"
	// EnvRedisPasswordFile is --redis-password-file's variable.
	EnvRedisPasswordFile = "FLOODGATE_REDIS_PASSWORD_FILE"
	// EnvRedisUsernameFile is --redis-username-file's variable.
	EnvRedisUsernameFile = "FLOODGATE_REDIS_USERNAME_FILE"
	// EnvPodNamespace and EnvPodName, set from the downward API, are the
	// defaults of --namespace and --pod-name.
	EnvPodNamespace = "POD_NAMESPACE"
	EnvPodName      = "POD_NAME"
)

// MaxPartialMessage bounds a PartialMessage, within the pod condition
// message the sidecar writes.
const MaxPartialMessage = 1000

// partialSep separates the revision from the policies in a PartialMessage.
const partialSep = "; not loaded: "

// moreMarker ends a PartialMessage whose list did not fit.
const moreMarker = ", and more"

// PartialMessage is the message of a ReasonPartiallyLoaded condition: the
// revision in force, then the names of the policies not loaded,
// "<revision>; not loaded: a, b". When the names do not fit in
// MaxPartialMessage, the list ends with ", and more", and a reader must
// then take every policy as not loaded.
func PartialMessage(revision string, failed []string) string {
	msg := revision + partialSep
	for i, name := range failed {
		next := name
		if i > 0 {
			next = ", " + name
		}
		if len(msg)+len(next)+len(moreMarker) > MaxPartialMessage {
			if i == 0 {
				return msg + strings.TrimPrefix(moreMarker, ", ")
			}
			return msg + moreMarker
		}
		msg += next
	}
	return msg
}

// ParsePartialMessage reads a PartialMessage: the revision in force, the
// policies not loaded, and complete = false when the list was cut short
// (every policy must then be taken as not loaded).
func ParsePartialMessage(msg string) (revision string, failed []string, complete bool) {
	revision, list, ok := strings.Cut(msg, partialSep)
	if !ok {
		return "", nil, false
	}
	complete = true
	for _, name := range strings.Split(list, ", ") {
		switch name {
		case "":
		case strings.TrimPrefix(moreMarker, ", "):
			complete = false
		default:
			failed = append(failed, name)
		}
	}
	return revision, failed, complete
}
