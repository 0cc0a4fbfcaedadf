// Package configsource delivers sidecar config documents to the runner.
// A Source watches one origin (a file, or the namespace's ConfigMap in
// package kubesource) and hands each new document, or the error that kept
// it from reading one, to a deliver callback; the runner applies every
// update in one place and keeps the last good config when a document is
// invalid. The package imports nothing of the sidecar, so the control
// plane can depend on the contract without linking the data plane.
package configsource

import "context"

// Update is one observation of a config source: a document, or the error
// that kept the source from reading one.
type Update struct {
	Data   []byte
	Err    error
	Origin string
	// Result, when set, is called once the runner has applied or rejected
	// the update, before deliver returns. The Kubernetes source reports it
	// as the pod's policy-loaded condition.
	Result func(Outcome)
}

// Outcome is what the runner did with an update.
type Outcome struct {
	// InForce is the revision in force afterwards; empty when none.
	InForce string
	// Err is nil when the update was applied, and the reason it was
	// rejected otherwise.
	Err error
	// Failed names (by name within the namespace, as the manager's
	// Programmed condition looks them up) the policies of the revision in
	// force that this sidecar could not compile and does not enforce;
	// each policy compiles on its own, and the others are in force.
	Failed []string
}

// Source delivers config documents. The standalone sidecar watches a file;
// a Kubernetes source watches the namespace's ConfigMap. Whatever the
// source, the runner applies updates in one place (runner.Runner.apply), which
// keeps the last good config when a document is invalid.
type Source interface {
	// Run delivers the current document, then every change, until ctx
	// ends. deliver is never called concurrently.
	Run(ctx context.Context, deliver func(Update))
}
