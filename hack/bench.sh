#!/usr/bin/env bash
# bench.sh is `make bench`: floodgate's micro-benchmarks and load harnesses.
# Results go to stdout and, as JSON, into $BENCH_OUT (default bench/). Each
# harness pins the process under test and its load to different cores with
# taskset where it exists, and reports figures next to a reference measured
# in the same run (x/time/rate, a direct call to the backend, nginx, a null
# ShouldRateLimit server, redis-benchmark's EVALSHA ceiling).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${BENCH_OUT:-$ROOT/bench}"
mkdir -p "$OUT"
hack/redis-cluster.sh install

# install_nginx installs Debian's nginx-light, the reference floodgate-bench
# measures the sidecar beside, without starting its packaged service (a
# policy-rc.d answering 101 keeps dpkg from starting it; the bench runs its
# own nginx on loopback ports).
install_nginx() {
  if command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]]; then
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ "$(id -u)" != 0 ]]; then
    echo "bench.sh: nginx is missing and cannot be installed here (needs root and apt-get); floodgate-bench skips its nginx reference" >&2
    return 0
  fi
  echo "bench.sh: installing nginx-light from Debian" >&2
  local policy=/usr/sbin/policy-rc.d had_policy=0
  if [[ -e "$policy" ]]; then had_policy=1; fi
  if [[ "$had_policy" == 0 ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f '"$policy"'' EXIT
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nginx-light >&2; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nginx-light >&2
  fi
  if [[ "$had_policy" == 0 ]]; then
    rm -f "$policy"
    trap - EXIT
  fi
  if [[ -x /etc/init.d/nginx ]]; then
    /etc/init.d/nginx stop >/dev/null 2>&1 || true
  fi
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now nginx.service >/dev/null 2>&1 || true
  fi
}
install_nginx

echo "== micro-benchmarks: limiter, memstore, engine (ns/op, allocs/op; x/time/rate reference)"
go test -run '^$' -bench . -benchmem -benchtime 2000000x ./sidecar/limiter/ | tee "$OUT/micro.txt"
go test -run '^$' -bench 'Take|XTime|MemoryFloor' -benchmem -benchtime 2000000x ./sidecar/store/memstore/ | tee -a "$OUT/micro.txt"
# One iteration builds a million keys: it is a measurement, not a loop.
go test -run '^$' -bench HeapPerKey -benchtime 1x ./sidecar/store/memstore/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench . -benchmem ./sidecar/engine/ ./sidecar/match/ | tee -a "$OUT/micro.txt"

echo "== counter store: decisions/s with 64 callers, batching on and off, EVALSHA ceiling"
hack/with-reaper.sh go run ./bench/cmd/floodgate-storebench | tee "$OUT/store.txt"

echo "== split counter: one key at 10x what one shard answers, split 3 on 3 masters with leases (exactness, Redis CPU per master)"
hack/with-reaper.sh go run ./bench/cmd/floodgate-splitbench -duration 10s | tee "$OUT/split.txt"

echo "== sidecar: beside nginx (CPU per request proxied and denied, added latency; ratios), then added latency, decisions/s for cold, hot allowed and hot denied keys, script calls in a flood"
hack/with-reaper.sh go run ./bench/cmd/floodgate-bench -duration 5s -out "$OUT/sidecar.json"

echo "== Envoy ShouldRateLimit: decisions/s and CPU per decision against a null server"
hack/with-reaper.sh go run ./bench/cmd/floodgate-rlsbench -out "$OUT/rls.json"

echo "== load shedder: an application of capacity C under 3 x C, 20% critical; the shedder against no shedding and a static concurrency cap (critical success and p99, goodput)"
hack/with-reaper.sh go run ./bench/cmd/floodgate-shedbench -out "$OUT/shed.json"
hack/with-reaper.sh go run ./bench/cmd/floodgate-shedbench -reserve-critical 60 -reserve-default 0 -out "$OUT/shed-reserve60.json"

echo "== delay instead of deny: 3 sidecars on Redis with onExceed: Delay (100/s, maxDelay 2s) under 300/s on one key, beside nginx limit_req burst=200 (no nodelay): arrivals per second, delayed and refused, delay percentiles, CPU per delayed request; RSS with 10,000 requests waiting in a sidecar and in nginx"
hack/with-reaper.sh go run ./bench/cmd/floodgate-delaybench -out "$OUT/delay.json" | tee "$OUT/delay.txt"
