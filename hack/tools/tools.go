//go:build tools

// Package tools pins the versions of the tools floodgate's Makefile uses.
// It is a separate module so that the tools' dependencies never move the
// project's. hack/tools.sh builds each tool on first use into a cache
// outside the checkout.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "sigs.k8s.io/controller-runtime/tools/setup-envtest"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
