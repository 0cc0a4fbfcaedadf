// Package injection is floodgate-manager's sidecar injector: a mutating
// admission webhook for Pods, and the pure function, Inject, that builds
// the injected pod.
//
// # Opting in
//
// Only pods annotated floodgate.dev/inject: "true" reach the webhook (the
// webhook configuration's matchConditions), and never pods of kube-system,
// kube-public, kube-node-lease or the manager's own namespace (its
// namespaceSelector). The handler checks both again, so a configuration
// edited by hand cannot make it touch other pods.
//
// # The injected sidecar
//
// The sidecar is a native sidecar container named floodgate-sidecar: the
// first init container, with restartPolicy Always, so that it starts before
// the application and stops after it. It runs under the restricted Pod
// Security profile (non-root, read-only root file system, no capabilities,
// no privilege escalation, the RuntimeDefault seccomp profile) and proxies
// explicitly, without iptables. It gets the pod's name and namespace from
// the downward API, the pod's labels as the file
// /etc/floodgate/podinfo/labels, its own service account token (a
// projected volume, so it works even when the pod does not mount one), the
// store password as the file /etc/floodgate/store-auth/password from the
// Secret floodgate-store-auth that the manager mirrors into the namespace
// (an optional volume: the sidecar starts before the Secret exists and reads
// the file again for every new connection, so a rotated password needs no
// restart), and the Secrets and ConfigMaps that the
// namespace's policies reference for JWT verification, under
// compiler.MountDir.
//
// # Port takeover
//
// Services select a pod port by name or by number. The sidecar takes over
// the name: the application's port named, say, "http" is renamed
// "app-http" (its number does not change), and the sidecar declares a new
// port named "http" on its listen port and proxies to the application on
// 127.0.0.1. A Service with targetPort: http therefore sends its traffic
// through the sidecar with no change. A Service that targets the number
// (targetPort: 8080) still reaches the application directly, bypassing the
// sidecar: point it at the name, or at the sidecar's listen port. The
// application's probes and lifecycle hooks that named the port are
// rewritten to the new name, so they keep reaching the application.
//
// The port to protect is floodgate.dev/upstream-port (a port name or
// number) when set; otherwise the only TCP port the containers declare, or
// else the one named "http". The sidecar listens on
// floodgate.dev/listen-port when set, otherwise on DefaultListenPort (or
// the next free port). Its admin port, named fg-admin, is DefaultAdminPort
// unless the application uses it.
//
// # Resources
//
// The sidecar's resources default to Options.Resources and can be set per
// pod with the annotations floodgate.dev/sidecar-cpu-request,
// floodgate.dev/sidecar-cpu-limit, floodgate.dev/sidecar-memory-request and
// floodgate.dev/sidecar-memory-limit (Kubernetes quantities such as 100m or
// 128Mi). A limit set without its request lowers the default request to the
// limit when the default would exceed it.
//
// # Failure policy
//
// The webhook's failurePolicy is Fail. Only opted-in pods reach it, so an
// outage of the webhook delays only the pods that asked for a sidecar, and
// an opted-in pod never runs without one. An annotation that asks for
// something impossible (an unknown port name, a listen port that collides
// with an application port, a bad quantity) is rejected with a message
// that names the annotation.
//
// # Idempotency and look-alikes
//
// An opted-in pod that already has the container named floodgate-sidecar
// that Inject writes is returned unchanged, so a reinvocation of the
// webhook (reinvocationPolicy IfNeeded) or a second admission adds
// nothing. One whose floodgate-sidecar container is anything else (another
// image, other arguments, environment or mounts, volumes from other
// sources, weaker security settings) is rejected (VerifySidecar): a
// container posing as the sidecar could pass the readiness gate without
// enforcing anything. Pods that are not opted in are not looked at.
package injection
