#!/usr/bin/env bash
# envtest-assets.sh prints a directory holding kube-apiserver, etcd and kubectl
# for Kubernetes $K8S_VERSION, ready to be used as KUBEBUILDER_ASSETS.
#
# It first tries setup-envtest's normal download. Where that fails (no
# internet), it builds the binaries from the Go module proxy with the real
# version stamped in. The result is cached outside the checkout, under
# $FLOODGATE_CACHE (default ~/.cache/floodgate), and a complete cache is reused.
# Binaries are built into a temporary name and renamed into place only when
# the build succeeded, so a half-built binary never counts as cached.
#
# Progress goes to stderr; only the directory is printed on stdout.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.0}"
CACHE="${FLOODGATE_CACHE:-$HOME/.cache/floodgate}"
DIR="$CACHE/envtest/$K8S_VERSION"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'envtest-assets: %s\n' "$*" >&2; }

complete() {
  [[ -x "$DIR/kube-apiserver" && -x "$DIR/etcd" && -x "$DIR/kubectl" && -f "$DIR/.complete" ]]
}

if complete; then
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"

# kubectl: the machine's own is fine when it is within one minor version.
machine_kubectl_ok() {
  command -v kubectl >/dev/null 2>&1 || return 1
  local v minor want
  v=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1)
  [[ -n "$v" ]] || return 1
  want=$(echo "$K8S_VERSION" | cut -d. -f2)
  minor=$v
  (( minor >= want - 1 && minor <= want + 1 ))
}

# 1. setup-envtest's normal download.
try_download() {
  local setup
  setup=$("$ROOT/hack/tools.sh" setup-envtest 2>/dev/null) || return 1
  local out
  out=$(timeout 120 "$setup" use "$K8S_VERSION" --bin-dir "$CACHE/setup-envtest" -p path 2>/dev/null) || return 1
  [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]] || return 1
  cp "$out/kube-apiserver" "$DIR/kube-apiserver.tmp" && mv "$DIR/kube-apiserver.tmp" "$DIR/kube-apiserver"
  cp "$out/etcd" "$DIR/etcd.tmp" && mv "$DIR/etcd.tmp" "$DIR/etcd"
  if [[ -x "$out/kubectl" ]]; then
    cp "$out/kubectl" "$DIR/kubectl.tmp" && mv "$DIR/kubectl.tmp" "$DIR/kubectl"
  fi
  return 0
}

# 2. Build from the Go module proxy.
build_from_proxy() {
  local work="$CACHE/envtest/build-$K8S_VERSION"
  local minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
  local staging="0.${K8S_VERSION#*.}"
  mkdir -p "$work"
  cd "$work"
  if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" go.mod; then
    log "preparing a build module for Kubernetes v$K8S_VERSION in $work"
    rm -f go.mod go.sum
    cat > go.mod <<MOD
module floodgate.dev/envtest-build

go 1.26
MOD
    GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
    local kdir
    kdir=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    {
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
      grep -E '^\s*k8s.io/[^ ]+ => \./staging' "$kdir/go.mod" \
        | awk -v v="v$staging" '{print "replace " $1 " => " $1 " " v}'
    } >> go.mod
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    log "resolving the module graph (go mod tidy)"
    GOFLAGS=-mod=mod go mod tidy >&2
  fi
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  if [[ ! -x "$DIR/etcd" ]]; then
    log "building etcd $ETCD_VERSION (about 20 s)"
    go build -trimpath -ldflags "-s -w" -o "$DIR/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$DIR/etcd.tmp" "$DIR/etcd"
  fi
  if [[ ! -x "$DIR/kube-apiserver" ]]; then
    log "building kube-apiserver v$K8S_VERSION (about 9 min on 2 cores)"
    go build -trimpath -ldflags "$ld" -o "$DIR/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver && mv "$DIR/kube-apiserver.tmp" "$DIR/kube-apiserver"
  fi
  if [[ ! -x "$DIR/kubectl" ]]; then
    if machine_kubectl_ok; then
      log "using the machine's kubectl"
      ln -sf "$(command -v kubectl)" "$DIR/kubectl"
    else
      log "building kubectl v$K8S_VERSION (the machine's is missing or more than one minor version away)"
      go build -trimpath -ldflags "$ld" -o "$DIR/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl && mv "$DIR/kubectl.tmp" "$DIR/kubectl"
    fi
  fi
}

if [[ "${FLOODGATE_ENVTEST_BUILD:-}" != "1" ]] && try_download; then
  log "downloaded by setup-envtest"
fi
if [[ ! -x "$DIR/kube-apiserver" || ! -x "$DIR/etcd" || ! -x "$DIR/kubectl" ]]; then
  log "setup-envtest could not download the binaries; building them from the Go module proxy"
  build_from_proxy
fi
touch "$DIR/.complete"
echo "$DIR"
