package config

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
const ConditionPolicyLoaded = "floodgate.dev/policy-loaded"

// Reasons of ConditionPolicyLoaded.
const (
	// ReasonLoaded (True): the latest document of the ConfigMap is in
	// force; the message is its revision.
	ReasonLoaded = "Loaded"
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
	// StoreAuthUserKey is the store user's key in the same Secret, when
	// the store has users (Redis ACLs): a managed store's sidecar user.
	// Without it the password is the default user's.
	StoreAuthUserKey = "username"
	// StoreAuthUserFile is the store user's file, read with the password
	// through EnvRedisUsernameFile. A missing file means the default user.
	StoreAuthUserFile = StoreAuthDir + "/" + StoreAuthUserKey

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
