#!/usr/bin/env bash
# Regenerate the wrapper modules (go.mod/go.sum) for the versions in versions.env. Run only when bumping
# versions; the result is committed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0

rm -rf "$HERE/containerd" "$HERE/cni"
mkdir -p "$HERE/containerd" "$HERE/cni"
cd "$HERE/containerd"
go mod init nodewright.local/realnode/containerd && go mod edit -go=1.26.0
go get -tool "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
cd "$HERE/cni"
go mod init nodewright.local/realnode/cni && go mod edit -go=1.26.0
for p in main/bridge ipam/host-local main/loopback; do
  go get -tool "github.com/containernetworking/plugins/plugins/$p@$CNI_PLUGINS_VERSION"
done
