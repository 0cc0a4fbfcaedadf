#!/usr/bin/env bash
# demo.sh runs floodgate's local environment on one machine and shows it
# working: envtest's real kube-apiserver and etcd, and a real 3x1 Redis
# Cluster on loopback. Everything it starts is stopped when it ends, at the
# end or on Ctrl-C (make demo also runs it under hack/with-reaper.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${FLOODGATE_DEMO_DIR:-$ROOT/.demo}"
REDIS_DIR="$WORK/redis"
KUBECONFIG_FILE="$WORK/kubeconfig"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
info() { printf '   %s\n' "$*"; }

cleanup() {
  local rc=$?
  step "Stopping everything"
  [[ -n "${LOCALENV_PID:-}" ]] && kill -TERM "$LOCALENV_PID" 2>/dev/null && wait "$LOCALENV_PID" 2>/dev/null
  hack/redis-cluster.sh stop --dir "$REDIS_DIR" >/dev/null 2>&1 || true
  info "control plane and Redis Cluster stopped"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$WORK"
start=$(date +%s)

step "Preparing: redis-server, envtest binaries (kube-apiserver, etcd, kubectl 1.37)"
hack/redis-cluster.sh install
ASSETS=$(hack/envtest-assets.sh)
export KUBEBUILDER_ASSETS="$ASSETS"
KUBECTL="$ASSETS/kubectl --kubeconfig $KUBECONFIG_FILE"
info "envtest assets: $ASSETS"

step "Starting the local control plane (real kube-apiserver + etcd)"
go build -o "$WORK/localenv" ./hack/localenv
"$WORK/localenv" -kubeconfig "$KUBECONFIG_FILE" > "$WORK/localenv.out" 2> "$WORK/localenv.log" &
LOCALENV_PID=$!
for _ in $(seq 1 120); do
  grep -q ready "$WORK/localenv.out" 2>/dev/null && break
  kill -0 "$LOCALENV_PID" 2>/dev/null || { cat "$WORK/localenv.log"; exit 1; }
  sleep 0.5
done
info "$($KUBECTL version 2>/dev/null | sed -n 's/^Server Version: /kube-apiserver /p')"
info "readyz: $($KUBECTL get --raw /readyz)"
$KUBECTL get crd -o name 2>/dev/null | sed 's/^/   installed /'

step "Starting a Redis Cluster: 3 masters, 1 replica each, on loopback"
ADDRS=$(hack/redis-cluster.sh start --dir "$REDIS_DIR")
info "seed addresses: $ADDRS"
hack/redis-cluster.sh status --dir "$REDIS_DIR" | sed 's/^/   /'

step "Healthy after $(( $(date +%s) - start ))s"
