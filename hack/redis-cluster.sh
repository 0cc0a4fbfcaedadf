#!/usr/bin/env bash
# redis-cluster.sh runs a real Redis Cluster on loopback for floodgate's tests
# and demo.
#
#   redis-cluster.sh install
#       Installs redis-server and redis-tools from Debian when missing (as
#       root, or through sudo) and keeps Debian's own redis service off:
#       floodgate never relies on a system redis.
#   redis-cluster.sh start [--masters N] [--replicas M] [--dir DIR] [--base-port P]
#       Starts N masters (default 3) with M replicas each (default 1) on
#       127.0.0.1, ports P, P+1, ... (default 7001; the cluster bus uses
#       port+10000; both stay below the kernel's ephemeral ports), forms the cluster with `redis-cli --cluster create`,
#       waits until every node reports cluster_state:ok with all 16384 slots
#       covered and every replica has completed its first sync (until then
#       Redis will not promote it), and prints the seed addresses, comma
#       separated, on stdout. Replicas sync at once (repl-diskless-sync-delay
#       0) rather than after Redis's default 5s.
#       Nothing is persisted (--save '' --appendonly no). A shard without
#       a master does not stop the others (cluster-require-full-coverage
#       no): a rate limiter wants the live shards to keep answering.
#   redis-cluster.sh stop [--dir DIR]
#       Kills the nodes recorded in DIR and removes DIR.
#   redis-cluster.sh status [--dir DIR]
#       Prints each recorded node: address, pid, role and cluster state.
#       Exits non-zero when a node is down or the cluster is not ok.
#
# DIR defaults to $FLOODGATE_REDIS_DIR or ${TMPDIR:-/tmp}/floodgate-redis-cluster.
# Each node's pid is recorded in DIR/node-<port>.pid, its log in
# DIR/node-<port>.log; DIR/addrs holds the seed addresses.
set -euo pipefail

DIR="${FLOODGATE_REDIS_DIR:-${TMPDIR:-/tmp}/floodgate-redis-cluster}"
MASTERS=3
REPLICAS=1
BASE_PORT=7001
HOST=127.0.0.1
MARKER=".floodgate-redis-cluster"
WAIT_SECONDS="${FLOODGATE_REDIS_WAIT:-60}"

die() { echo "redis-cluster.sh: $*" >&2; exit 1; }
log() { echo "redis-cluster.sh: $*" >&2; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

find_bin() {
  local name="$1"
  if command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
  elif [[ -x "/usr/bin/$name" ]]; then
    echo "/usr/bin/$name"
  else
    return 1
  fi
}

# as_root runs a command as root, directly or through sudo.
as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@" || die "installing needs root: sudo -n $* failed (run as root, or allow sudo)"
  else
    die "installing redis needs root and sudo is not available: run 'apt-get install -y redis-server redis-tools' as root"
  fi
}

# disable_service stops and disables Debian's redis-server service if the
# package installed and started one.
disable_service() {
  if command -v systemctl >/dev/null 2>&1; then
    if [[ -d /run/systemd/system ]]; then
      as_root systemctl disable --now redis-server.service >/dev/null 2>&1 || true
    else
      # No running systemd: disable only removes the unit's symlinks.
      as_root systemctl disable redis-server.service >/dev/null 2>&1 || true
    fi
  elif command -v deb-systemd-helper >/dev/null 2>&1; then
    as_root deb-systemd-helper disable redis-server.service >/dev/null 2>&1 || true
  fi
  if [[ -x /etc/init.d/redis-server ]]; then
    as_root /etc/init.d/redis-server stop >/dev/null 2>&1 || true
    if command -v update-rc.d >/dev/null 2>&1; then
      as_root update-rc.d redis-server disable >/dev/null 2>&1 || true
    fi
  fi
}

cmd_install() {
  if find_bin redis-server >/dev/null && find_bin redis-cli >/dev/null; then
    log "redis-server $("$(find_bin redis-server)" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') already installed"
    return 0
  fi
  command -v apt-get >/dev/null 2>&1 || die "redis-server is missing and apt-get is not available: install redis-server 7 and redis-cli by hand"
  log "installing redis-server and redis-tools from Debian"
  # A policy-rc.d that answers 101 keeps dpkg from starting the packaged
  # service during the install; remove it again whatever happens.
  local policy=/usr/sbin/policy-rc.d had_policy=0
  if [[ -e "$policy" ]]; then had_policy=1; fi
  if [[ "$had_policy" == 0 ]]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    trap 'as_root rm -f '"$policy"'' EXIT
  fi
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server redis-tools >&2; then
    log "apt-get install failed; updating the package lists and trying again"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server redis-tools >&2
  fi
  if [[ "$had_policy" == 0 ]]; then
    as_root rm -f "$policy"
    trap - EXIT
  fi
  disable_service
  find_bin redis-server >/dev/null || die "redis-server still missing after apt-get install"
  log "installed $("$(find_bin redis-server)" --version)"
}

parse_flags() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --masters) MASTERS="${2:?--masters needs a value}"; shift 2 ;;
      --replicas) REPLICAS="${2:?--replicas needs a value}"; shift 2 ;;
      --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
      --base-port) BASE_PORT="${2:?--base-port needs a value}"; shift 2 ;;
      -h|--help) usage ;;
      *) die "unknown flag $1 (see --help)" ;;
    esac
  done
  [[ "$MASTERS" =~ ^[0-9]+$ ]] || die "--masters: want a number, got $MASTERS"
  [[ "$REPLICAS" =~ ^[0-9]+$ ]] || die "--replicas: want a number, got $REPLICAS"
  [[ "$BASE_PORT" =~ ^[0-9]+$ ]] || die "--base-port: want a number, got $BASE_PORT"
  (( MASTERS >= 3 )) || die "--masters: redis-cli --cluster create needs at least 3 masters, got $MASTERS"
  (( MASTERS <= 100 )) || die "--masters: at most 100, got $MASTERS"
  (( REPLICAS <= 5 )) || die "--replicas: at most 5, got $REPLICAS"
  local total=$(( MASTERS * (REPLICAS + 1) ))
  (( BASE_PORT >= 1024 && BASE_PORT + total - 1 + 10000 <= 65535 )) ||
    die "--base-port: ports $BASE_PORT..$((BASE_PORT + total - 1)) and their bus ports (+10000) must lie in 1024..65535"
}

# port_busy reports whether something listens on 127.0.0.1:$1.
port_busy() {
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

node_ports() {
  local f
  for f in "$DIR"/node-*.pid; do
    [[ -e "$f" ]] || continue
    f="${f##*/node-}"
    echo "${f%.pid}"
  done | sort -n
}

# redis_pid prints the pid recorded for port $1 if that process is alive
# and is a redis-server.
redis_pid() {
  local pid
  pid="$(cat "$DIR/node-$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/comm" ]] || return 1
  [[ "$(cat "/proc/$pid/comm")" == redis-server* ]] || return 1
  echo "$pid"
}

cmd_start() {
  parse_flags "$@"
  local server cli
  server="$(find_bin redis-server)" || die "redis-server not found: run 'hack/redis-cluster.sh install'"
  cli="$(find_bin redis-cli)" || die "redis-cli not found: run 'hack/redis-cluster.sh install'"
  if [[ -d "$DIR" ]] && [[ -n "$(node_ports)" ]]; then
    die "$DIR already holds a cluster: run 'hack/redis-cluster.sh stop --dir $DIR' first"
  fi
  local total=$(( MASTERS * (REPLICAS + 1) )) i port
  for (( i = 0; i < total; i++ )); do
    port=$(( BASE_PORT + i ))
    if port_busy "$port" || port_busy $(( port + 10000 )); then
      die "port $port or its bus port $((port + 10000)) is in use on $HOST: pick another --base-port"
    fi
  done
  mkdir -p "$DIR"
  touch "$DIR/$MARKER"
  local addrs=()
  for (( i = 0; i < total; i++ )); do
    port=$(( BASE_PORT + i ))
    mkdir -p "$DIR/$port"
    "$server" --port "$port" --bind "$HOST" --protected-mode no \
      --cluster-enabled yes --cluster-config-file "$DIR/$port/nodes.conf" \
      --cluster-node-timeout 2000 --cluster-require-full-coverage no \
      --repl-diskless-sync-delay 0 \
      --save '' --appendonly no --dir "$DIR/$port" \
      --daemonize yes --pidfile "$DIR/node-$port.pid" --logfile "$DIR/node-$port.log" \
      || { cmd_stop_dir; die "redis-server on port $port failed to start"; }
    addrs+=("$HOST:$port")
  done
  # Wait for every node to answer and record its pid.
  local deadline=$(( SECONDS + WAIT_SECONDS ))
  for (( i = 0; i < total; i++ )); do
    port=$(( BASE_PORT + i ))
    until [[ "$("$cli" -h "$HOST" -p "$port" ping 2>/dev/null)" == PONG ]] && redis_pid "$port" >/dev/null; do
      if grep -qE 'aborting|Failed listening|FATAL' "$DIR/node-$port.log" 2>/dev/null; then
        tail -n 5 "$DIR/node-$port.log" >&2 || true
        cmd_stop_dir
        die "redis-server on port $port failed to start (see the log lines above); pick another --base-port?"
      fi
      if (( SECONDS > deadline )); then
        tail -n 5 "$DIR/node-$port.log" >&2 || true
        cmd_stop_dir
        die "redis-server on port $port did not come up within ${WAIT_SECONDS}s"
      fi
      sleep 0.1
    done
  done
  log "forming the cluster: $MASTERS masters, $REPLICAS replicas each"
  if ! "$cli" --cluster create "${addrs[@]}" --cluster-replicas "$REPLICAS" --cluster-yes >"$DIR/create.log" 2>&1; then
    cat "$DIR/create.log" >&2
    cmd_stop_dir
    die "redis-cli --cluster create failed"
  fi
  for (( i = 0; i < total; i++ )); do
    port=$(( BASE_PORT + i ))
    until "$cli" -h "$HOST" -p "$port" cluster info 2>/dev/null | tr -d '\r' |
      grep -q '^cluster_state:ok$' &&
      "$cli" -h "$HOST" -p "$port" cluster info 2>/dev/null | tr -d '\r' |
      grep -q '^cluster_slots_ok:16384$'; do
      if (( SECONDS > deadline )); then
        "$cli" -h "$HOST" -p "$port" cluster info >&2 || true
        cmd_stop_dir
        die "node $HOST:$port did not reach cluster_state:ok with 16384 slots within ${WAIT_SECONDS}s"
      fi
      sleep 0.1
    done
  done
  # A replica whose first sync has not completed cannot be promoted (Redis
  # refuses: "Disconnected from master for longer than allowed"), so the
  # cluster is ready only once every replica is in sync with its master.
  for (( i = 0; i < total; i++ )); do
    port=$(( BASE_PORT + i ))
    until repl="$("$cli" -h "$HOST" -p "$port" info replication 2>/dev/null | tr -d '\r')" &&
      { grep -q '^role:master$' <<<"$repl" ||
        { grep -q '^master_link_status:up$' <<<"$repl" && grep -q '^master_sync_in_progress:0$' <<<"$repl"; }; }; do
      if (( SECONDS > deadline )); then
        echo "$repl" >&2
        cmd_stop_dir
        die "replica $HOST:$port did not complete its first sync with its master within ${WAIT_SECONDS}s"
      fi
      sleep 0.1
    done
  done
  local seeds
  seeds="$(IFS=,; echo "${addrs[*]}")"
  echo "$seeds" >"$DIR/addrs"
  log "cluster ok in $DIR"
  echo "$seeds"
}

# cmd_stop_dir kills the recorded nodes and removes DIR, but only a DIR
# that this script made.
cmd_stop_dir() {
  [[ -d "$DIR" ]] || return 0
  [[ -e "$DIR/$MARKER" ]] || die "$DIR was not made by redis-cluster.sh: not touching it"
  local port pid pids=()
  for port in $(node_ports); do
    if pid="$(redis_pid "$port")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local deadline=$(( SECONDS + 5 ))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if (( SECONDS > deadline )); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.05
    done
  done
  rm -rf "$DIR"
}

cmd_stop() {
  parse_flags "$@"
  cmd_stop_dir
  log "stopped; removed $DIR"
}

cmd_status() {
  parse_flags "$@"
  local cli
  cli="$(find_bin redis-cli)" || die "redis-cli not found: run 'hack/redis-cluster.sh install'"
  [[ -d "$DIR" ]] || die "no cluster in $DIR"
  local port pid ok=0 role state
  for port in $(node_ports); do
    if ! pid="$(redis_pid "$port")"; then
      echo "$HOST:$port down"
      ok=1
      continue
    fi
    role="$("$cli" -h "$HOST" -p "$port" role 2>/dev/null | head -n 1 | tr -d '\r')" || role=unreachable
    state="$("$cli" -h "$HOST" -p "$port" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p')" || state=unknown
    echo "$HOST:$port pid=$pid role=${role:-unreachable} cluster_state=${state:-unknown}"
    [[ "$state" == ok ]] || ok=1
  done
  [[ -f "$DIR/addrs" ]] && echo "seeds: $(cat "$DIR/addrs")"
  return "$ok"
}

sub="${1:-}"
[[ $# -gt 0 ]] && shift
case "$sub" in
  install) cmd_install ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  status) cmd_status "$@" ;;
  -h|--help|help|"") usage ;;
  *) die "unknown command $sub (want install, start, stop or status)" ;;
esac
