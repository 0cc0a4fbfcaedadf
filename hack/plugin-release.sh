#!/usr/bin/env bash
# Builds the release archives of kubectl-floodgate and its krew manifest:
#
#   hack/plugin-release.sh VERSION [OUT]
#
# For each platform of cmd/kubectl-floodgate/krew/floodgate.yaml it builds
# kubectl-floodgate (CGO off, -trimpath, stripped, the version linked in)
# and packs it with LICENSE into OUT/kubectl-floodgate_VERSION_OS_ARCH.tar.gz
# (default OUT: bin/release). It then writes OUT/SHA256SUMS and
# OUT/floodgate.yaml, the krew manifest with the version and the archives'
# sha256 sums filled in.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${1:?usage: hack/plugin-release.sh VERSION [OUT]}"
OUT="${2:-bin/release}"
PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64)
TEMPLATE=cmd/kubectl-floodgate/krew/floodgate.yaml

mkdir -p "$OUT"
manifest="$(grep -v "^#" "$TEMPLATE")"
manifest="${manifest//\$\{VERSION\}/$VERSION}"
: >"$OUT/SHA256SUMS"
for p in "${PLATFORMS[@]}"; do
	os="${p%/*}" arch="${p#*/}"
	bin=kubectl-floodgate
	[ "$os" = windows ] && bin=kubectl-floodgate.exe
	stage="$(mktemp -d)"
	echo "building $os/$arch" >&2
	CGO_ENABLED=0 GOOS="$os" GOARCH="$arch" go build -trimpath \
		-ldflags "-s -w -X github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/app.Version=$VERSION" \
		-o "$stage/$bin" ./cmd/kubectl-floodgate
	cp LICENSE "$stage/"
	archive="kubectl-floodgate_${VERSION}_${os}_${arch}.tar.gz"
	# Reproducible archives: fixed order, owner and times.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00:00Z' \
		-C "$stage" -cf - "$bin" LICENSE | gzip -n >"$OUT/$archive"
	rm -rf "$stage"
	sum="$(sha256sum "$OUT/$archive" | cut -d' ' -f1)"
	echo "$sum  $archive" >>"$OUT/SHA256SUMS"
	manifest="${manifest//\$\{SHA256_${os}_${arch}\}/$sum}"
done
if grep -q '\${' <<<"$manifest"; then
	echo "plugin-release: placeholders left in the manifest:" >&2
	grep -n '\${' <<<"$manifest" >&2
	exit 1
fi
printf '%s\n' "$manifest" >"$OUT/floodgate.yaml"
ls -l "$OUT" >&2
