#!/usr/bin/env bash
# app-servers.sh installs the real application servers the sidecar's
# suites run behind it (sidecar/runner's appservers_test.go): Node.js for
# its http module. Go's net/http needs nothing. Idempotent; run by
# `make test-deps`.
set -euo pipefail

log() { echo "app-servers.sh: $*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo "$@"; fi; }

if command -v node >/dev/null 2>&1; then
  log "node $(node --version) already installed"
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || die "node is missing and apt-get is not available: install Node.js by hand"
log "installing nodejs from Debian"
if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs >&2; then
  log "apt-get install failed; updating the package lists and trying again"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs >&2
fi
command -v node >/dev/null 2>&1 || die "node still missing after apt-get install"
log "installed node $(node --version)"
