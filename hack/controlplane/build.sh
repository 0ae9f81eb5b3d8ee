#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok)
# and the kubelet of the simulator's real nodes from Go modules into a version-keyed cache outside the
# repository. A second run with every binary present is a no-op.
#
# Each component is built from its own wrapper module under hack/controlplane/<name>/ so that dependency
# versions never mix (minimal version selection would otherwise lift shared dependencies above what each
# release was tested with). The wrapper go.mod/go.sum files are committed: later builds are verified
# against the recorded checksums.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT=${NODEWRIGHT_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/controlplane}
OUT="$CACHE_ROOT/$CONTROLPLANE_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[controlplane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

BINARIES="etcd kwok kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler"
complete() {
  [ -f "$OUT/.complete" ] || return 1
  for b in $BINARIES; do [ -x "$OUT/$b" ] || return 1; done
}
if complete; then
  log "cached binaries in $OUT"
  exit 0
fi
command -v go >/dev/null || { log "Go is required (1.26+): install it and retry"; exit 1; }
mkdir -p "$OUT"
start=$(date +%s)

k8s_ldflags() {
  local minor ld="-s -w"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$ld"
}

build_k8s() {
  log "kube-apiserver, kube-controller-manager, kubectl $K8S_VERSION (first build: 20-40 min on 2 cores)"
  (cd "$HERE/k8s" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$(k8s_ldflags)" -o "$OUT/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl)
  "$OUT/kube-apiserver" --version >&2
}

build_k8s_nodes() {
  # The same module, tags and version stamps as the control plane: with its build cache warm, about a minute.
  log "kubelet, kube-scheduler $K8S_VERSION"
  (cd "$HERE/k8s" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$(k8s_ldflags)" -o "$OUT/" \
      k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-scheduler)
  "$OUT/kubelet" --version >&2
}

build_etcd() {
  log "etcd $ETCD_VERSION"
  (cd "$HERE/etcd" && go build -trimpath -ldflags="-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3)
  "$OUT/etcd" --version | head -1 >&2
}

build_kwok() {
  log "kwok $KWOK_VERSION"
  (cd "$HERE/kwok" && go build -trimpath -ldflags="-s -w" -o "$OUT/kwok" sigs.k8s.io/kwok/cmd/kwok)
  "$OUT/kwok" --version >&2 || true
  # The stock node/pod stage bundles are read from the module cache at run time, never copied.
  (cd "$HERE/kwok" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION") |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' > "$OUT/kwok-module-dir"
  # Keep a copy of the stage bundles next to the binaries so a cleaned module cache does not break runs.
  rm -rf "$OUT/kwok-stages" && mkdir -p "$OUT/kwok-stages"
  cp -r "$(cat "$OUT/kwok-module-dir")/kustomize/stage/." "$OUT/kwok-stages/"
  chmod -R u+w "$OUT/kwok-stages"
}

[ -x "$OUT/etcd" ] || build_etcd
[ -x "$OUT/kwok" ] && [ -d "$OUT/kwok-stages" ] || build_kwok
[ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ] && [ -x "$OUT/kubectl" ] || build_k8s
[ -x "$OUT/kubelet" ] && [ -x "$OUT/kube-scheduler" ] || build_k8s_nodes
date -u +%FT%TZ > "$OUT/.complete"
log "done in $(( $(date +%s) - start ))s: $OUT"
