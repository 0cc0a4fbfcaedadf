// Package simnode runs floodgate's whole Kubernetes loop on one machine
// with real parts, for `make demo` (hack/demo) and the end-to-end suite
// (test/e2e):
//
//   - a control plane: envtest's kube-apiserver and etcd, floodgate's CRDs
//     applied with the real kubectl, and the webhook configurations of
//     config/webhook registered against a local serving address;
//   - floodgate-manager as a local process serving those webhooks;
//   - for an annotated Pod that the injection webhook mutated, the injected
//     floodgate-sidecar container run as a local process with exactly the
//     injected arguments and environment (resolved as the kubelet would),
//     in front of a local backend that plays the app container;
//   - the kubelet's part: the downward-API labels file, and marking the Pod
//     Running and Ready once the sidecar reports its policy loaded.
//
// Only loopback addresses are used. What differs from a real node is
// explicit: there is no pod network namespace, so each pod gets a loopback
// address of its own as its pod IP (PodIP), where its sidecar serves the
// injected admin port, as floodgate-manager expects to read it; the
// sidecar's listen and upstream addresses are overridden with free
// loopback ones, and it reaches the API server with a kubeconfig instead
// of the in-cluster service account.
//
// # Lifetimes
//
// Every process a Stack starts has Pdeathsig set to SIGKILL, so it dies
// with the process that started it, and Stack.Stop stops them all in
// reverse order. envtest's kube-apiserver and etcd are stopped by Stop;
// they run in their own process groups and do not get Pdeathsig, which is
// why `make test` and `make demo` run under hack/with-reaper.sh.
//
// A Stack is safe for concurrent use once its control plane is started:
// several sidecars may be started from different goroutines.
package simnode
