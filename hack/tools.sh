#!/usr/bin/env bash
# tools.sh TOOL prints the path of a pinned tool, building it on first use.
#
# The versions are pinned in the hack/tools Go module, which is separate so
# that the tools' dependencies never move the project's. Binaries are cached
# outside the checkout under $FLOODGATE_CACHE/tools/<tool>-<version>, built
# into a temporary name and renamed only on success.
#
# Tools: controller-gen, setup-envtest, helm, golangci-lint.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FLOODGATE_CACHE:-$HOME/.cache/floodgate}"
tool="${1:?usage: tools.sh controller-gen|setup-envtest|helm|golangci-lint}"

case "$tool" in
  controller-gen) pkg=sigs.k8s.io/controller-tools/cmd/controller-gen; mod=sigs.k8s.io/controller-tools ;;
  setup-envtest)  pkg=sigs.k8s.io/controller-runtime/tools/setup-envtest; mod=$pkg ;;
  helm)           pkg=helm.sh/helm/v3/cmd/helm; mod=helm.sh/helm/v3 ;;
  golangci-lint)  pkg=github.com/golangci/golangci-lint/v2/cmd/golangci-lint; mod=github.com/golangci/golangci-lint/v2 ;;
  *) echo "tools.sh: unknown tool $tool" >&2; exit 2 ;;
esac

cd "$ROOT/hack/tools"
version=$(go list -m -f '{{.Version}}' "$mod")
bin="$CACHE/tools/$tool-$version"
# helm is stamped with the Kubernetes version floodgate targets, so that
# `helm template` and `helm lint` assume 1.37 rather than helm's default 1.20.
[[ "$tool" == helm ]] && bin="$bin-k8s1.37"
if [[ ! -x "$bin" ]]; then
  mkdir -p "$CACHE/tools"
  echo "tools.sh: building $tool $version (first use)" >&2
  ldflags="-s -w"
  if [[ "$tool" == helm ]]; then
    ldflags="$ldflags -X helm.sh/helm/v3/internal/version.version=$version"
    for p in pkg/chartutil pkg/lint/rules; do
      ldflags="$ldflags -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=37"
    done
  fi
  go build -trimpath -ldflags "$ldflags" -o "$bin.tmp.$$" "$pkg"
  mv "$bin.tmp.$$" "$bin"
fi
echo "$bin"
