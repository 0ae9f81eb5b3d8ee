#!/usr/bin/env bash
# Regenerate the wrapper modules (go.mod/go.sum) for the versions in versions.env. Run only when bumping
# versions; the result is committed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0
STAGING="v0.${K8S_VERSION#v1.}"

rm -rf "$HERE/k8s" "$HERE/etcd" "$HERE/kwok"
mkdir -p "$HERE/k8s" "$HERE/etcd" "$HERE/kwok"

cd "$HERE/k8s"
go mod init nodewright.local/controlplane/k8s
MOD=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
# k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them to ./staging; a consumer must
# replace each one with its published tag.
grep -oE 'k8s\.io/[A-Za-z0-9._-]+ => \./staging/src/k8s\.io/[A-Za-z0-9._-]+' "$MOD" | awk '{print $1}' | sort -u |
  while read -r m; do go mod edit -replace="$m=$m@$STAGING"; done
go mod edit -go="$(awk '/^go /{print $2; exit}' "$MOD")"
GODBG=$(awk '/^godebug /{print $2; exit}' "$MOD"); if [ -n "$GODBG" ]; then go mod edit -godebug="$GODBG"; fi
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
  "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
  "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" \
  "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
  "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION"

cd "$HERE/etcd"
go mod init nodewright.local/controlplane/etcd
go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"

cd "$HERE/kwok"
go mod init nodewright.local/controlplane/kwok
go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
