#!/usr/bin/env bash
# bench.sh is `make bench`: floodgate's micro-benchmarks and load harnesses.
# Results go to stdout and, as JSON, into $BENCH_OUT (default bench/). Each
# harness pins the process under test and its load to different cores with
# taskset where it exists, and reports figures next to a reference measured
# in the same run (x/time/rate, a direct call to the backend, a null
# ShouldRateLimit server, redis-benchmark's EVALSHA ceiling).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${BENCH_OUT:-$ROOT/bench}"
mkdir -p "$OUT"
hack/redis-cluster.sh install

echo "== micro-benchmarks: limiter, memstore, engine (ns/op, allocs/op; x/time/rate reference)"
go test -run '^$' -bench . -benchmem -benchtime 2000000x ./sidecar/limiter/ | tee "$OUT/micro.txt"
go test -run '^$' -bench 'Take|XTime|MemoryFloor' -benchmem -benchtime 2000000x ./sidecar/store/memstore/ | tee -a "$OUT/micro.txt"
# One iteration builds a million keys: it is a measurement, not a loop.
go test -run '^$' -bench HeapPerKey -benchtime 1x ./sidecar/store/memstore/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench . -benchmem ./sidecar/engine/ ./sidecar/match/ | tee -a "$OUT/micro.txt"

echo "== counter store: decisions/s with 64 callers, batching on and off, EVALSHA ceiling"
hack/with-reaper.sh go run ./bench/cmd/floodgate-storebench | tee "$OUT/store.txt"

echo "== sidecar: added latency, decisions/s for cold, hot allowed and hot denied keys, script calls in a flood"
hack/with-reaper.sh go run ./bench/cmd/floodgate-bench -duration 5s -out "$OUT/sidecar.json"

echo "== Envoy ShouldRateLimit: decisions/s and CPU per decision against a null server"
hack/with-reaper.sh go run ./bench/cmd/floodgate-rlsbench -out "$OUT/rls.json"
