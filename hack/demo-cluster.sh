#!/usr/bin/env bash
# demo-cluster.sh runs the README's "On your own cluster" path, command for
# command, on the real node of hack/cluster.sh: helm install of the chart
# with the images of `make images`, an annotated sample Deployment and a
# RateLimitPolicy, and a curl loop through kubectl port-forward that shows
# 200s turning into 429s. `make demo-cluster` runs it inside
# `hack/cluster.sh run`, which starts the node first and removes it at the
# end or on Ctrl-C.
#
# It needs KUBECONFIG and FLOODGATE_KUBECTL (set by cluster.sh run) and
# FLOODGATE_HELM (hack/tools.sh helm).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KUBECONFIG="${FLOODGATE_CLUSTER_KUBECONFIG:?run me with hack/cluster.sh run (make demo-cluster)}"
kubectl() { "${FLOODGATE_KUBECTL:?}" "$@"; }
helm() { "${FLOODGATE_HELM:?}" "$@"; }
T0=$SECONDS
step() { printf '\n[%s] %s  (t=%ds)\n' "$1" "$2" "$((SECONDS - T0))"; }
show() { printf '$ %s\n' "$*"; "$@" 2>&1 | sed 's/^/    /'; }

cd "$ROOT"
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/floodgate/Chart.yaml)

step 1/5 "The node, and the images of make images imported into its containerd"
show kubectl get nodes -o wide
ls bin/images/*.tar | sed 's/^/    /'

step 2/5 "helm install"
show helm install floodgate charts/floodgate -n floodgate-system --create-namespace --wait --timeout 5m
show kubectl -n floodgate-system get pods
for _ in $(seq 1 120); do
  [[ "$(kubectl get counterstore default -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]] && break
  sleep 1
done
show kubectl get counterstore default

step 3/5 "An annotated Deployment of the sample backend, its Service, and a RateLimitPolicy"
kubectl create namespace shop >/dev/null
cat > /tmp/floodgate-demo-app.yaml <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: checkout, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: checkout}}
  template:
    metadata:
      labels: {app: checkout}
      annotations: {floodgate.dev/inject: "true"}
    spec:
      containers:
      - name: app
        image: ghcr.io/floodgate-dev/floodgate-sample-backend:$version
        ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: checkout, namespace: shop}
spec:
  selector: {app: checkout}
  ports: [{port: 80, targetPort: http}]
---
apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: checkout, namespace: shop}
spec:
  podSelector: {matchLabels: {app: checkout}}
  rules:
  - name: per-api-key
    match: {path: {type: Prefix, value: /api/}}
    key: [{header: X-API-Key}]
    limit: {requests: 5, per: 1m}
EOF
sed 's/^/    /' /tmp/floodgate-demo-app.yaml
show kubectl apply -f /tmp/floodgate-demo-app.yaml
show kubectl -n shop rollout status deployment/checkout --timeout 3m
show kubectl -n shop get pods
show kubectl -n shop get rlp

step 4/5 "Traffic through the Service (kubectl port-forward): 5 per minute per API key"
kubectl -n shop port-forward svc/checkout 18080:80 >/dev/null 2>&1 &
pf=$!
trap 'kill $pf 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do curl -s -o /dev/null localhost:18080/ && break; sleep 0.2; done
echo '$ for i in $(seq 1 8); do curl -s -o /dev/null -w "%{http_code} " -H "X-API-Key: alice" localhost:18080/api/orders; done'
printf '    '
for i in $(seq 1 8); do curl -s -o /dev/null -w "%{http_code} " -H "X-API-Key: alice" localhost:18080/api/orders; done
echo
echo '$ curl -si -H "X-API-Key: alice" localhost:18080/api/orders'
curl -si -H "X-API-Key: alice" localhost:18080/api/orders | tr -d '\r' | grep -v '^Date:' | sed 's/^/    /'
echo
kill $pf 2>/dev/null || true

step 5/5 "helm uninstall"
show kubectl delete namespace shop --wait=true
show helm uninstall floodgate -n floodgate-system --wait
printf '\ndemo finished in %ds\n' "$((SECONDS - T0))"
