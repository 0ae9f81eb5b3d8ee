#!/usr/bin/env bash
# Build the Krew asset of `kubectl nodewright` for one platform:
#   krew/build.sh linux amd64 [OUTDIR]
# -> OUTDIR/kubectl-nodewright_<os>_<arch>.tar.gz (default OUTDIR dist/) holding
#    kubectl-nodewright      a launcher: python3.11 with lib/ on the path, `nodewright.cli.plugin:main`
#    lib/                    this package and its dependencies, wheels for that platform (pip --target)
#    LICENSE
# and prints its sha256 (what krew-release-bot puts in krew/nodewright.yaml). Needs pip and access to
# the package index; wheels are fetched for CPython 3.11 and the platform, so one machine builds all.
set -euo pipefail
os=${1:?usage: krew/build.sh OS ARCH [OUTDIR]}
arch=${2:?usage: krew/build.sh OS ARCH [OUTDIR]}
out=${3:-dist}
cd "$(dirname "$0")/.."
case "$os/$arch" in
  linux/amd64) platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64) ;;
  linux/arm64) platforms=(--platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64) ;;
  darwin/arm64) platforms=(--platform macosx_11_0_arm64) ;;
  *) echo "unsupported platform $os/$arch" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --quiet --no-deps --wheel-dir "$work/own" .
python3 -m pip install --quiet --target "$work/root/lib" --python-version 3.11 --implementation cp \
  --only-binary=:all: "${platforms[@]}" "$work"/own/*.whl
cat > "$work/root/kubectl-nodewright" <<'LAUNCHER'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd -P)
PYTHONPATH="$here/lib${PYTHONPATH:+:$PYTHONPATH}" exec python3.11 -c 'import sys; from nodewright.cli.plugin import main; sys.exit(main())' "$@"
LAUNCHER
chmod 755 "$work/root/kubectl-nodewright"
[ -f LICENSE ] && cp LICENSE "$work/root/"
mkdir -p "$out"
asset="$out/kubectl-nodewright_${os}_${arch}.tar.gz"
tar -C "$work/root" -czf "$asset" .
sha256sum "$asset"
