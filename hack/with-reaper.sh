#!/usr/bin/env bash
# with-reaper.sh CMD [ARGS...] runs CMD and makes sure that nothing it
# started outlives it: no redis-server, etcd, kube-apiserver or sidecar.
#
# Every descendant inherits FLOODGATE_RUN_ID. When CMD ends, or when this
# script gets SIGINT or SIGTERM, every process still carrying that id is
# sent SIGTERM, then SIGKILL after a grace period. envtest starts its
# processes in their own process groups, so killing a process group would
# miss them; the environment marker does not.
set -uo pipefail

# Not exported: only CMD's tree carries the id, never this script's own
# helper processes.
RUN_ID="fg-$$-$RANDOM$RANDOM"

# marked prints the pids of live processes that carry this run's id.
marked() {
  grep -lzx "FLOODGATE_RUN_ID=$RUN_ID" /proc/[0-9]*/environ 2>/dev/null \
    | sed -n 's#^/proc/\([0-9]*\)/environ$#\1#p' || true
}

reap() {
  local pids left names
  pids=$(marked)
  [[ -z "$pids" ]] && return 0
  names=$(ps -o comm= -p "${pids//$'\n'/,}" 2>/dev/null | tr '\n' ' ')
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 1 50); do
    left=$(marked)
    [[ -z "$left" ]] && break
    sleep 0.1
  done
  left=$(marked)
  [[ -n "$left" ]] && kill -KILL $left 2>/dev/null
  echo "with-reaper: stopped leftover processes: $names" >&2
}

child=
on_signal() {
  [[ -n "$child" ]] && kill -INT "$child" 2>/dev/null
  # Give the command a moment to clean up by itself, then reap.
  for _ in $(seq 1 100); do
    kill -0 "$child" 2>/dev/null || break
    sleep 0.1
  done
  reap
  exit 130
}
trap on_signal INT TERM

FLOODGATE_RUN_ID="$RUN_ID" "$@" &
child=$!
wait "$child"
rc=$?
reap
exit "$rc"
