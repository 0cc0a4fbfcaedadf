#!/usr/bin/env bash
# demo.sh is `make demo`: it builds and runs hack/demo, which runs floodgate
# end to end on this machine with real parts (envtest's kube-apiserver and
# etcd, a Redis Cluster on loopback, floodgate-manager and an injected
# floodgate-sidecar) and prints a report. Everything it starts is stopped at
# the end or on Ctrl-C. Extra arguments go to hack/demo (-keep keeps it all
# running after the report).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${FLOODGATE_DEMO_DIR:-$ROOT/.demo}"
mkdir -p "$WORK/bin"
go build -o "$WORK/bin/demo" ./hack/demo
exec "$WORK/bin/demo" -work "$WORK" "$@"
