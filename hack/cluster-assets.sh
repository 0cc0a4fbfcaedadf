#!/usr/bin/env bash
# cluster-assets.sh prints a directory holding the node binaries of
# Kubernetes $K8S_VERSION that envtest does not ship: kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy. hack/cluster.sh
# runs them beside envtest's etcd, kube-apiserver and kubectl
# (hack/envtest-assets.sh).
#
# No release download is reachable here, so they are built from the Go
# module proxy the way hack/envtest-assets.sh builds kube-apiserver: one
# throwaway module that requires k8s.io/kubernetes at the release and
# replaces its staging modules by their published versions, with the real
# version stamped in (kubelet reports it to the API server, which shows it
# as the node's version). The result is cached under
# $FLOODGATE_CACHE/cluster/<version>; a binary is built into a temporary
# name and renamed into place only when the build succeeded.
#
# Progress goes to stderr; only the directory is printed on stdout.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.37.2}"
CACHE="${FLOODGATE_CACHE:-$HOME/.cache/floodgate}"
DIR="$CACHE/cluster/$K8S_VERSION"
BINARIES=(kubelet kube-controller-manager kube-scheduler kube-proxy)
log() { printf 'cluster-assets: %s\n' "$*" >&2; }

complete() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$DIR/$b" ]] || return 1; done
  [[ -f "$DIR/.complete" ]]
}

if complete; then
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"

work="$CACHE/cluster/build-$K8S_VERSION"
minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
staging="0.${K8S_VERSION#*.}"
mkdir -p "$work"
cd "$work"
if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" go.mod; then
  log "preparing a build module for Kubernetes v$K8S_VERSION in $work"
  rm -f go.mod go.sum
  cat > go.mod <<MOD
module floodgate.dev/cluster-build

go 1.26
MOD
  GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
  kdir=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  {
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    grep -E '^\s*k8s.io/[^ ]+ => \./staging' "$kdir/go.mod" \
      | awk -v v="v$staging" '{print "replace " $1 " => " $1 " " v}'
  } >> go.mod
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for b in "${BINARIES[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
    printf ')\n'
  } > tools.go
  log "resolving the module graph (go mod tidy)"
  GOFLAGS=-mod=mod go mod tidy >&2
fi
ld="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
for b in "${BINARIES[@]}"; do
  [[ -x "$DIR/$b" ]] && continue
  log "building $b v$K8S_VERSION"
  start=$SECONDS
  go build -trimpath -ldflags "$ld" -o "$DIR/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv "$DIR/$b.tmp" "$DIR/$b"
  log "built $b in $((SECONDS - start))s"
done
touch "$DIR/.complete"
echo "$DIR"
