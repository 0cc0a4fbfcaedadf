#!/usr/bin/env bash
# sync-chart-crds.sh copies what controller-gen generates into the Helm chart:
#   config/crd/bases/*.yaml -> charts/floodgate/crds/       (CRDs, installed by helm)
#   config/rbac/role.yaml   -> charts/floodgate/files/manager-role.yaml
#                              (the rules of the manager's ClusterRoles and
#                              of the metrics reader role)
#   config/rbac/sidecar_pod_status_policy.yaml
#                           -> charts/floodgate/files/sidecar-pod-status-policy.yaml
#                              (the ValidatingAdmissionPolicy that keeps each
#                              sidecar to its own pod's condition)
#   config/webhook/pod_labels_policy.yaml
#                           -> charts/floodgate/files/pod-labels-policy.yaml
#                              (the ValidatingAdmissionPolicy that keeps the
#                              labels floodgate's NetworkPolicies trust to
#                              the pods floodgate labels)
# Run it after `make manifests`. With --check it changes nothing and exits 1
# when the chart's copies differ from the generated files, naming them.
# test/helmchart fails on the same drift.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/floodgate"
check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# Pairs of generated file and chart copy.
pairs=()
shopt -s nullglob
crds=("$ROOT"/config/crd/bases/*.yaml)
if (( ${#crds[@]} == 0 )); then
  echo "sync-chart-crds: no CRDs in config/crd/bases; run make manifests" >&2
  exit 1
fi
for src in "${crds[@]}"; do
  pairs+=("$src" "$CHART/crds/$(basename "$src")")
done
pairs+=("$ROOT/config/rbac/role.yaml" "$CHART/files/manager-role.yaml")
pairs+=("$ROOT/config/rbac/sidecar_pod_status_policy.yaml" "$CHART/files/sidecar-pod-status-policy.yaml")
pairs+=("$ROOT/config/webhook/pod_labels_policy.yaml" "$CHART/files/pod-labels-policy.yaml")

drift=()
for ((i = 0; i < ${#pairs[@]}; i += 2)); do
  src=${pairs[i]} dst=${pairs[i+1]}
  if ! cmp -s "$src" "$dst"; then
    drift+=("${dst#"$ROOT"/}")
    if ! $check; then
      mkdir -p "$(dirname "$dst")"
      cp "$src" "$dst.tmp.$$" && mv "$dst.tmp.$$" "$dst"
    fi
  fi
done
# CRDs removed from config/crd/bases leave the chart too.
for dst in "$CHART"/crds/*.yaml; do
  if [[ ! -e "$ROOT/config/crd/bases/$(basename "$dst")" ]]; then
    drift+=("${dst#"$ROOT"/} (stale)")
    $check || rm -f "$dst"
  fi
done

if (( ${#drift[@]} > 0 )); then
  if $check; then
    printf 'sync-chart-crds: the chart is out of date with the generated manifests; run hack/sync-chart-crds.sh:\n' >&2
    printf '  %s\n' "${drift[@]}" >&2
    exit 1
  fi
  printf 'sync-chart-crds: updated %s\n' "${drift[@]}" >&2
fi
