#!/usr/bin/env bash
# Build helm (v3) from Go modules into a version-keyed cache outside the repository, for the chart tests
# (lint, template, install/upgrade/uninstall against the local control plane, package/push to an OCI
# registry). A second run with the binary present is a no-op. The last line on stdout is the binary's path.
#
# The wrapper module (go.mod/go.sum next to this script) is committed, so the build is verified against the
# recorded checksums; hack/helm/regen.sh regenerates it when HELM_VERSION changes.
#   ${NODEWRIGHT_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/helm}/<version>/helm
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT=${NODEWRIGHT_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/helm}
OUT="$CACHE_ROOT/$HELM_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$OUT/helm" ]; then
  log "cached: $OUT/helm"
  echo "$OUT/helm"
  exit 0
fi
command -v go >/dev/null || { log "Go is required (1.26+): install it and retry"; exit 1; }
mkdir -p "$OUT"
start=$(date +%s)
cd "$HERE"

# What helm's own Makefile sets: the version it reports, and the Kubernetes version `helm template` and
# `helm lint` assume without a cluster (one minor above the client-go it is built with; the defaults
# without these flags are 1.20, which fails every chart with a newer kubeVersion).
client_go=$(go list -f '{{.Version}}' -m k8s.io/client-go)   # v0.35.1 -> Kubernetes 1.35
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ld="$ld -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
done

log "helm $HELM_VERSION (first build: 3-6 min on 2 cores)"
go build -trimpath -ldflags="$ld" -o "$OUT/helm.partial" helm.sh/helm/v3/cmd/helm
"$OUT/helm.partial" version --short >&2
mv -f "$OUT/helm.partial" "$OUT/helm"
log "done in $(( $(date +%s) - start ))s: $OUT/helm"
echo "$OUT/helm"
