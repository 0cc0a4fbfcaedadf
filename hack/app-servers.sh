#!/usr/bin/env bash
# app-servers.sh installs the real application servers the sidecar's
# suites run behind it (sidecar/runner's appservers_test.go and its
# differential harness, differential_test.go): Node.js for its http
# module, Debian's Python with Werkzeug, and nginx. Go's net/http needs
# nothing. Idempotent; run by `make test-deps`.
set -euo pipefail

log() { echo "app-servers.sh: $*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo "$@"; fi; }

have_node() { command -v node >/dev/null 2>&1; }
have_werkzeug() { [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import werkzeug' >/dev/null 2>&1; }
have_nginx() { command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]]; }

missing=()
have_node || missing+=(nodejs)
have_werkzeug || missing+=(python3-werkzeug)
have_nginx || missing+=(nginx-light)
if ((${#missing[@]} == 0)); then
  log "node $(node --version), werkzeug and nginx already installed"
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || die "${missing[*]} missing and apt-get is not available: install them by hand"
log "installing ${missing[*]} from Debian"
# Debian's nginx package would start nginx on port 80: the suites start
# their own, so no service is started here.
policy=/usr/sbin/policy-rc.d
own_policy=
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
  as_root chmod +x "$policy"
  own_policy=1
fi
cleanup() { if [[ -n $own_policy ]]; then as_root rm -f "$policy"; fi; }
trap cleanup EXIT
install() { as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
if ! install; then
  log "apt-get install failed; updating the package lists and trying again"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  install
fi
have_node || die "node still missing after apt-get install"
have_werkzeug || die "Werkzeug still missing from /usr/bin/python3 after apt-get install"
have_nginx || die "nginx still missing after apt-get install"
log "installed node $(node --version), werkzeug and nginx"
