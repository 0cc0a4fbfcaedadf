# floodgate Makefile.
#
# The two commands a new user needs are `make demo` and `make test`; both
# install or build everything they use. Slow caches (tools, envtest
# binaries) live outside the checkout in $(FLOODGATE_CACHE).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export FLOODGATE_CACHE ?= $(HOME)/.cache/floodgate
BIN ?= bin
GO ?= go
GO_TEST_FLAGS ?= -race -shuffle=on -timeout 30m
PKGS ?= ./...
# The Go client's modules (client/, client/grpcclient/): modules of their own
# so that programs using them take no dependency of floodgate's. make test,
# vet, lint and verify cover them when PKGS is the whole tree.
CLIENT_MODULES := client client/grpcclient
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

CONTROLLER_GEN = $(shell hack/tools.sh controller-gen)
HELM = $(shell hack/tools.sh helm)
GOLANGCI_LINT = $(shell hack/tools.sh golangci-lint)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-12s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: ## Generate deepcopy code from the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: ## Generate CRDs, RBAC and webhook configurations from markers.
	$(CONTROLLER_GEN) crd rbac:roleName=floodgate-manager webhook paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	hack/sync-chart-crds.sh

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -s -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet (and on the client modules).
	$(GO) vet $(PKGS)
ifeq ($(PKGS),./...)
	for m in $(CLIENT_MODULES); do (cd $$m && $(GO) vet ./...); done
endif

.PHONY: lint
lint: ## Run golangci-lint (config in .golangci.yml), on the client modules too.
	$(GOLANGCI_LINT) run --timeout 15m --allow-parallel-runners $(PKGS)
ifeq ($(PKGS),./...)
	for m in $(CLIENT_MODULES); do (cd $$m && $(GOLANGCI_LINT) run --timeout 15m --allow-parallel-runners ./...); done
endif

.PHONY: verify
verify: generate manifests ## Fail when generated files or go.mod/go.sum drift.
	$(GO) mod tidy
	cd hack/tools && $(GO) mod tidy
	for m in $(CLIENT_MODULES); do (cd $$m && $(GO) mod tidy); done
	@test -z "$$(gofmt -s -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -s -l $$(git ls-files '*.go'); exit 1; }
	git diff --exit-code -- api config go.mod go.sum hack/tools/go.mod hack/tools/go.sum charts client/go.mod client/grpcclient/go.mod client/grpcclient/go.sum
	@untracked=$$(git ls-files --others --exclude-standard -- api config charts); \
	  if [ -n "$$untracked" ]; then echo "untracked generated files:"; echo "$$untracked"; exit 1; fi

.PHONY: build
build: ## Build floodgate-manager, floodgate-sidecar and kubectl-floodgate into bin/.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

##@ Images and a real node

.PHONY: images
images: ## Build OCI image archives into bin/images: manager, sidecar, Redis, sample backend, pause (no Docker).
	hack/redis-cluster.sh install
	nice $(GO) run ./hack/images -out $(BIN)/images

.PHONY: cluster-up
cluster-up: images ## Start one real Kubernetes node here (root): etcd, apiserver, controllers, containerd, kubelet, CNI, kube-proxy.
	FLOODGATE_IMAGES_BUILT=1 hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the node and remove every trace: processes, mounts, netns, iptables chains, cgroups.
	hack/cluster.sh down

.PHONY: plugin-release
plugin-release: ## Build kubectl-floodgate's release archives and krew manifest into bin/release (VERSION=vX.Y.Z).
	hack/plugin-release.sh $(VERSION) $(BIN)/release

##@ Test

.PHONY: test-deps
test-deps: ## Install redis-server and Node.js, and build the envtest binaries and tools.
	hack/redis-cluster.sh install
	hack/app-servers.sh
	hack/envtest-assets.sh >/dev/null
	hack/tools.sh helm >/dev/null

.PHONY: test
test: ## Run go vet, every unit, envtest and real-Redis suite, then the real-node suite (both run, whichever fails).
	@failed=; \
	$(MAKE) --no-print-directory test-unit || failed="$$failed test-unit"; \
	$(MAKE) --no-print-directory test-cluster || failed="$$failed test-cluster"; \
	if [ -n "$$failed" ]; then echo "make test failed in:$$failed" >&2; exit 1; fi

.PHONY: test-unit
test-unit: test-deps vet ## Run the unit, envtest and real-Redis suites (everything but test/cluster).
	KUBEBUILDER_ASSETS="$$(hack/envtest-assets.sh)" FLOODGATE_HELM="$$(hack/tools.sh helm)" \
		hack/with-reaper.sh $(GO) test $(GO_TEST_FLAGS) $$($(GO) list $(PKGS) | grep -v /test/cluster)
ifeq ($(PKGS),./...)
	for m in $(CLIENT_MODULES); do (cd $$m && $(GO) test $(GO_TEST_FLAGS) ./...); done
endif

N ?= 5
.PHONY: test-flakes
test-flakes: test-deps ## Run the timing-sensitive suites (hack/flakes/suites.txt) N times (default 5) beside two busy loops; report failures per test and spec.
	KUBEBUILDER_ASSETS="$$(hack/envtest-assets.sh)" FLOODGATE_HELM="$$(hack/tools.sh helm)" \
		hack/with-reaper.sh $(GO) run ./hack/flakes -n $(N) -busy 2 -build-flags "-race"

.PHONY: test-cluster
test-cluster: test-deps images ## Run the real-node suite (test/cluster) on a node that hack/cluster.sh starts, then removes (root).
	FLOODGATE_IMAGES_BUILT=1 FLOODGATE_HELM="$$(hack/tools.sh helm)" \
		hack/cluster.sh run $(GO) test -count=1 -timeout 30m -v ./test/cluster/ -ginkgo.v

.PHONY: bench
bench: build ## Run the micro-benchmarks and the load harnesses.
	hack/bench.sh

##@ Demo

.PHONY: demo
demo: ## Run the whole system locally and show it working.
	hack/with-reaper.sh hack/demo.sh

.PHONY: demo-cluster
demo-cluster: test-deps images ## Run the README's "On your own cluster" path on a real node here (root): helm install, a policy, 200s turning into 429s.
	FLOODGATE_IMAGES_BUILT=1 FLOODGATE_HELM="$$(hack/tools.sh helm)" hack/cluster.sh run hack/demo-cluster.sh
