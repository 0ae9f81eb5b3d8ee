#!/usr/bin/env bash
# Regenerate the wrapper module (go.mod/go.sum) for the helm version in versions.env. Run only when
# bumping the version; the result is committed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0
cd "$HERE"
rm -f go.mod go.sum
go mod init nodewright.local/tools/helm
go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
# `go mod init` writes the local Go version; ask only for what helm itself needs.
MOD=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
go mod edit -go="$(awk '/^go /{print $2; exit}' "$MOD")"
go mod tidy
