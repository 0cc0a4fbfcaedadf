#!/usr/bin/env bash
# cluster.sh up|down|status|run CMD... runs one real Kubernetes node on this
# machine, for the real-node suite (test/cluster), `make demo-cluster` and
# trying the chart by hand. It needs root and cgroup v1 or v2.
#
#   up      start the node; print how to reach it
#   down    stop everything and remove every trace (idempotent)
#   status  say what runs
#   run CMD start the node, run CMD with FLOODGATE_CLUSTER_KUBECONFIG set,
#           then stop it, also when CMD fails or on Ctrl-C (SIGINT/SIGTERM)
#
# The node runs, as host processes started with setsid (so a Ctrl-C at the
# terminal reaches this script, which stops them in order):
#   - etcd and kube-apiserver (envtest's, hack/envtest-assets.sh),
#   - kube-controller-manager and kube-scheduler,
#   - containerd and runc from Debian, and a kubelet,
#   - kube-proxy in iptables mode, so Services work,
#   - the CNI bridge plugin with host-local IPAM on $POD_CIDR.
# kubelet, kube-controller-manager, kube-scheduler and kube-proxy are built
# from the Go module proxy (hack/cluster-assets.sh). No CoreDNS: floodgate
# needs no names inside the cluster (sidecars and the manager reach the API
# server by the kubernetes Service's IP, the store by pod IPs, and the API
# server its webhooks by Service IP).
#
# The images come from `make images` (bin/images, built when missing) and
# are imported into containerd; nothing is pulled, so pods must use
# imagePullPolicy IfNotPresent or Never.
#
# Caches, kept between runs: the binaries ($FLOODGATE_CACHE/cluster/<v>,
# $FLOODGATE_CACHE/envtest/<v>) and containerd's content store
# ($FLOODGATE_CACHE/cluster/containerd). Everything else lives in
# $FLOODGATE_CACHE/cluster/run and is removed by down, which also removes
# the node's mounts, network namespaces, bridge, KUBE-* and CNI-* iptables
# chains, kubepods cgroups and processes, and puts back the kernel settings
# that up changed. Logs stay in $FLOODGATE_CACHE/cluster/logs until the
# next up.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FLOODGATE_CACHE:-$HOME/.cache/floodgate}"
K8S_VERSION="${K8S_VERSION:-1.37.2}"
BASE="$CACHE/cluster"
RUN="$BASE/run"
LOGS="$BASE/logs"
CTRD_ROOT="$BASE/containerd"
CTRD_STATE=/run/containerd
CTRD_SOCK=$CTRD_STATE/containerd.sock
IMAGES="${FLOODGATE_IMAGES:-$ROOT/bin/images}"
NODE_NAME="${FLOODGATE_NODE_NAME:-floodgate-node}"
POD_CIDR="${FLOODGATE_POD_CIDR:-10.244.0.0/24}"
SERVICE_CIDR="${FLOODGATE_SERVICE_CIDR:-10.96.0.0/24}"
API_SERVICE_IP="${SERVICE_CIDR%.*}.1"
BRIDGE=fgcni0
CNI_NET=floodgate
API_PORT=6443
ETCD_PORT=12379
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)
# Kernel settings that up, the kubelet or kube-proxy change; down puts
# back the values up found.
SYSCTLS=(net/ipv4/ip_forward net/bridge/bridge-nf-call-iptables net/bridge/bridge-nf-call-ip6tables
  net/ipv4/conf/all/route_localnet vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

need_root() { [[ $(id -u) == 0 ]] || die "must run as root (it starts containerd, a kubelet and kube-proxy)"; }

# packages installs Debian's containerd, runc, CNI plugins, iptables and
# conntrack when one is missing.
packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v ip >/dev/null || missing+=(iproute2)
  [[ ${#missing[@]} == 0 ]] && return 0
  log "installing ${missing[*]} from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

node_ip() {
  local ip
  ip=$(ip -4 route get 192.0.2.200 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)
  [[ -n "$ip" ]] || ip=$(ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')
  [[ -n "$ip" ]] || die "cannot find this machine's IPv4 address"
  echo "$ip"
}

# pki writes a CA, the API server's serving certificate, client
# certificates (admin in system:masters, the kubelet as
# system:node:<node>) and the service-account signing key.
pki() {
  local d="$RUN/pki" ip="$1"
  mkdir -p "$d"
  openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
  openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$d/ca.key"
  openssl_quiet req -x509 -new -key "$d/ca.key" -subj "/CN=floodgate-node-ca" -days 30 -out "$d/ca.crt"
  cert() { # name subject extensions
    openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$d/$1.key"
    openssl_quiet req -new -key "$d/$1.key" -subj "$2" -out "$d/$1.csr"
    printf '%s\n' "$3" > "$d/$1.ext"
    openssl_quiet x509 -req -in "$d/$1.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 30 -extfile "$d/$1.ext" -out "$d/$1.crt"
    rm -f "$d/$1.csr" "$d/$1.ext"
  }
  cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$ip,IP:$API_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=floodgate-admin" "extendedKeyUsage=clientAuth"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
  openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$d/sa.key"
  openssl_quiet ec -in "$d/sa.key" -pubout -out "$d/sa.pub"
  [[ -s "$d/sa.pub" && -s "$d/kubelet.crt" ]] || die "openssl failed to write the certificates in $d"
}

kubeconfig() { # file user
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: floodgate-node
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$RUN/pki/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$RUN/pki/$2.crt", client-key: "$RUN/pki/$2.key"}
contexts:
- name: floodgate-node
  context: {cluster: floodgate-node, user: $2}
current-context: floodgate-node
EOF
}

# start NAME ARGS... runs a daemon in its own session, logging to
# $LOGS/NAME.log, and records its pid.
start() {
  local name="$1"; shift
  setsid "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
  echo $! > "$RUN/$name.pid"
  disown $!
}

alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

# wait_for WHAT SECONDS CMD... retries CMD until it succeeds.
wait_for() {
  local what="$1" secs="$2" i; shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    local d
    for d in "${DAEMONS[@]}"; do
      if [[ -f "$RUN/$d.pid" ]] && ! alive "$d"; then
        log "$d exited; the end of $LOGS/$d.log:"; tail -20 "$LOGS/$d.log" >&2; return 1
      fi
    done
    sleep 0.2
  done
  log "timed out after ${secs}s waiting for $what"
  return 1
}

kubectl_() { "$KUBECTL" --kubeconfig "$RUN/kubeconfig" "$@"; }

up() {
  need_root
  local t0 t ip envtest assets
  t0=$(now)
  KUBECTL="$("$ROOT/hack/envtest-assets.sh")/kubectl"
  if [[ -f "$RUN/kubeconfig" ]] && alive kube-apiserver && alive kubelet; then
    log "the node is already up: KUBECONFIG=$RUN/kubeconfig"; return 0
  fi
  [[ -d "$RUN" ]] && { log "cleaning up a previous node first"; down; }
  packages
  t=$(now)
  envtest=$("$ROOT/hack/envtest-assets.sh")
  assets=$("$ROOT/hack/cluster-assets.sh")
  KUBECTL="$envtest/kubectl"
  log "binaries ready ($(since "$t")): $envtest, $assets"
  if [[ "${FLOODGATE_IMAGES_BUILT:-}" != 1 ]]; then
    t=$(now)
    (cd "$ROOT" && nice go run ./hack/images -out "$IMAGES") >&2
    log "images built ($(since "$t"))"
  fi
  local version pause
  version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/floodgate/Chart.yaml")
  pause="ghcr.io/floodgate-dev/floodgate-pause:$version"
  [[ -f "$IMAGES/floodgate-pause.tar" ]] || die "$IMAGES/floodgate-pause.tar is missing: run make images"

  ip=$(node_ip)
  mkdir -p "$RUN" "$LOGS" "$CTRD_ROOT" "$RUN/cni/net.d" "$RUN/cni/ipam" "$RUN/kubelet"
  rm -f "$LOGS"/*.log
  local s
  for s in "${SYSCTLS[@]}"; do
    [[ -f /proc/sys/$s ]] && echo "$s $(cat "/proc/sys/$s")" >> "$RUN/sysctls"
  done
  echo 1 > /proc/sys/net/ipv4/ip_forward
  [[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] && echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
  pki "$ip"
  kubeconfig "$RUN/kubeconfig" admin
  kubeconfig "$RUN/kubelet.kubeconfig" kubelet

  t=$(now)
  start etcd "$envtest/etcd" --name floodgate-node --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "floodgate-node=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync
  start kube-apiserver "$envtest/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 0.0.0.0 --secure-port "$API_PORT" --advertise-address "$ip" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
    --tls-cert-file "$RUN/pki/apiserver.crt" --tls-private-key-file "$RUN/pki/apiserver.key" \
    --client-ca-file "$RUN/pki/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$RUN/pki/admin.crt" --kubelet-client-key "$RUN/pki/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$RUN/pki/sa.pub" --service-account-signing-key-file "$RUN/pki/sa.key" \
    --profiling=false
  wait_for "kube-apiserver" 90 kubectl_ get --raw /readyz
  log "etcd and kube-apiserver $K8S_VERSION ready on https://127.0.0.1:$API_PORT ($(since "$t"))"
  start kube-controller-manager "$assets/kube-controller-manager" --kubeconfig "$RUN/kubeconfig" \
    --authentication-kubeconfig "$RUN/kubeconfig" --authorization-kubeconfig "$RUN/kubeconfig" \
    --service-account-private-key-file "$RUN/pki/sa.key" --root-ca-file "$RUN/pki/ca.crt" \
    --use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1 \
    --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false
  start kube-scheduler "$assets/kube-scheduler" --kubeconfig "$RUN/kubeconfig" \
    --authentication-kubeconfig "$RUN/kubeconfig" --authorization-kubeconfig "$RUN/kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --profiling=false

  # containerd with the CRI plugin, runc under cgroupfs, the CNI config
  # of this node and the pause image built here.
  cat > "$RUN/containerd.toml" <<EOF
version = 2
root = "$CTRD_ROOT"
state = "$CTRD_STATE"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CTRD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  enable_unprivileged_ports = true
  # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower
  # its oom_score_adj: the kubelet's -998 for the pod sandbox would fail
  # every pod. Keep the scores at or above containerd's own instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
EOF
  cat > "$RUN/cni/net.d/10-floodgate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$RUN/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  t=$(now)
  start containerd containerd --config "$RUN/containerd.toml"
  wait_for containerd 30 ctr --address "$CTRD_SOCK" version
  local f
  for f in "$IMAGES"/*.tar; do
    ctr --address "$CTRD_SOCK" -n k8s.io images import --no-unpack "$f" >/dev/null \
      || die "importing $f into containerd failed"
  done
  log "containerd $(containerd --version | awk '{print $3}') ready, $(ls "$IMAGES"/*.tar | wc -l) images imported from $IMAGES ($(since "$t"))"

  cat > "$RUN/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$RUN/pki/ca.crt"}
authorization: {mode: Webhook}
# cgroup v1 (this machine) is in maintenance: the kubelet refuses it unless
# told otherwise. containerd 1.6 lacks the CRI RuntimeConfig call, so the
# driver is configured here, matching containerd's SystemdCgroup = false.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTRD_SOCK
failSwapOn: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
readOnlyPort: 0
serializeImagePulls: false
# A test node on a shared disk: never evict for disk, never collect images.
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 60
EOF
  t=$(now)
  start kubelet "$assets/kubelet" --config "$RUN/kubelet.yaml" --kubeconfig "$RUN/kubelet.kubeconfig" \
    --root-dir "$RUN/kubelet" --hostname-override "$NODE_NAME" --node-ip "$ip" --v 1
  cat > "$RUN/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$RUN/kubeconfig"}
mode: iptables
clusterCIDR: "$POD_CIDR"
hostnameOverride: "$NODE_NAME"
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
EOF
  start kube-proxy "$assets/kube-proxy" --config "$RUN/kube-proxy.yaml"
  wait_for "node $NODE_NAME to be Ready" 120 node_ready
  wait_for "the default service account" 60 kubectl_ -n default get serviceaccount default
  log "kubelet $K8S_VERSION and kube-proxy (iptables) ready, node $NODE_NAME ($ip) Ready ($(since "$t"))"
  log "up in $(since "$t0"): export KUBECONFIG=$RUN/kubeconfig; kubectl: $KUBECTL"
}

node_ready() {
  [[ "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# stop NAME... sends SIGTERM to daemons, all at once, then SIGKILL to those
# still running after 10 s.
stop() {
  local name pids=() pid i running
  for name in "$@"; do
    [[ -f "$RUN/$name.pid" ]] || continue
    pid=$(cat "$RUN/$name.pid")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$RUN/$name.pid"
  done
  for ((i = 0; i < 50; i++)); do
    running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    [[ $running == 0 ]] && break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# kubepods_pids prints the pids of the processes in the node's pod
# cgroups.
kubepods_pids() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    if [[ -d "$d" ]]; then find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
  done | sort -u
}

# shim_pids prints the pids of containerd's runc shims for this node's
# containerd.
shim_pids() {
  local p
  for p in $(pgrep -f containerd-shim-runc-v2 2>/dev/null); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "-address $CTRD_SOCK" && echo "$p"
  done
  return 0
}

# our_mounts prints the node's mount points, deepest first.
our_mounts() {
  awk '{ print $5 }' /proc/self/mountinfo | sed 's/\\040/ /g' \
    | grep -E "^($RUN|$CTRD_ROOT|$CTRD_STATE|/run/netns/cni-|/var/run/netns/cni-)" | sort -r || true
}

down() {
  need_root
  local t d pids m n
  t=$(now)
  # The kubelet first, so that it restarts nothing.
  stop kubelet kube-proxy kube-scheduler kube-controller-manager
  # Containers: through containerd while it runs, so that the shims
  # unmount the root file systems and exit.
  if [[ -S "$CTRD_SOCK" ]] && ctr --address "$CTRD_SOCK" version >/dev/null 2>&1; then
    local c=(ctr --address "$CTRD_SOCK" -n k8s.io)
    for d in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -a -s SIGKILL "$d" >/dev/null 2>&1 || true; done
    for d in $("${c[@]}" tasks ls -q 2>/dev/null); do timeout 10 "${c[@]}" tasks delete -f "$d" >/dev/null 2>&1 || true; done
    for d in $("${c[@]}" containers ls -q 2>/dev/null); do "${c[@]}" containers delete "$d" >/dev/null 2>&1 || true; done
  fi
  stop containerd kube-apiserver etcd
  # Whatever is left: container processes, shims, daemons whose pid file
  # was lost.
  for n in 1 2 3; do
    pids="$(kubepods_pids) $(shim_pids)"
    pids=$(echo $pids)
    [[ -z "$pids" ]] && break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
  pids=$(pgrep -f "$RUN/|$BASE/$K8S_VERSION/|--config $RUN/containerd.toml" 2>/dev/null || true)
  [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
  # Mounts, deepest first; network namespaces; the bridge.
  for n in 1 2 3; do
    m=$(our_mounts)
    [[ -z "$m" ]] && break
    while IFS= read -r d; do umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || true; done <<< "$m"
  done
  for d in /run/netns/cni-*; do
    [[ -e "$d" ]] && { ip netns delete "$(basename "$d")" 2>/dev/null || rm -f "$d"; }
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  # iptables: every KUBE-* and CNI-* chain and every rule that mentions
  # one, in every table, other rules untouched.
  local save restore rules
  for save in iptables-save ip6tables-save; do
    command -v "$save" >/dev/null || continue
    restore=${save/save/restore}
    for n in 1 2 3; do
      # Read the rules first: grep -q would close the pipe early, and
      # under pipefail a SIGPIPE'd iptables-save reads as "no chains".
      rules=$("$save" 2>/dev/null) || break
      grep -qE 'KUBE-|CNI-' <<< "$rules" || break
      grep -vE 'KUBE-|CNI-' <<< "$rules" | "$restore" || log "$restore failed (try $n of 3)"
    done
  done
  # cgroups: the pod hierarchy in every controller, leaves first.
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  if [[ -f "$RUN/sysctls" ]]; then
    local s v
    while read -r s v; do echo "$v" > "/proc/sys/$s" 2>/dev/null || true; done < "$RUN/sysctls"
  fi
  rm -rf "$RUN"
  log "down in $(since "$t")"
  leftovers
}

# leftovers reports anything of the node still on the machine, and fails
# when there is any.
leftovers() {
  local bad=0 x
  # The node's daemons, shims and containers (whose programs run from the
  # images' root, /floodgate-*, redis-server, /pause); not processes of
  # the same names that tests run from a checkout.
  x=$(pgrep -a -f "^(containerd|/usr/bin/containerd|$BASE/|$CACHE/envtest/[^ ]*/(etcd|kube-apiserver) --[a-z-]* [^ ]*$BASE|/floodgate-|/pause)" 2>/dev/null || true)
  x+=$(kubepods_pids | tr '\n' ' ')
  [[ -n "$x" ]] && { log "left: processes:"; echo "$x" >&2; bad=1; }
  x=$(our_mounts); [[ -n "$x" ]] && { log "left: mounts: $x"; bad=1; }
  x=$(ls /run/netns 2>/dev/null | grep '^cni-' || true); [[ -n "$x" ]] && { log "left: netns: $x"; bad=1; }
  x=$(iptables-save 2>/dev/null | grep -cE 'KUBE-|CNI-' || true); [[ "$x" != 0 ]] && { log "left: $x iptables lines"; bad=1; }
  x=$(ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null || true); [[ -n "$x" ]] && { log "left: cgroups: $x"; bad=1; }
  ip link show "$BRIDGE" >/dev/null 2>&1 && { log "left: bridge $BRIDGE"; bad=1; }
  [[ $bad == 0 ]] && log "nothing left: no processes, mounts, netns, KUBE/CNI iptables chains, kubepods cgroups or bridge"
  return $bad
}

status() {
  local d
  for d in "${DAEMONS[@]}"; do
    if alive "$d"; then echo "$d: running (pid $(cat "$RUN/$d.pid"))"; else echo "$d: stopped"; fi
  done
  [[ -f "$RUN/kubeconfig" ]] && echo "KUBECONFIG=$RUN/kubeconfig"
  return 0
}

# run CMD... : up, CMD, down, with down also on SIGINT and SIGTERM.
run_cmd() {
  local rc=0
  trap 'trap - EXIT; down; exit 130' INT TERM
  trap 'down' EXIT
  up
  FLOODGATE_CLUSTER_KUBECONFIG="$RUN/kubeconfig" FLOODGATE_KUBECTL="$KUBECTL" "$@" || rc=$?
  trap - EXIT INT TERM
  down || true
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  leftovers) leftovers ;;
  run) shift; [[ $# -gt 0 ]] || die "usage: cluster.sh run CMD [ARGS...]"; run_cmd "$@" ;;
  *) echo "usage: cluster.sh up|down|status|leftovers|run CMD..." >&2; exit 2 ;;
esac
