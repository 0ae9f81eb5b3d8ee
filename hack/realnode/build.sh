#!/usr/bin/env bash
# Build the base root of the simulator's real nodes into a version-keyed cache outside the repository:
#   ${NODEWRIGHT_REALNODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/realnode}/<REALNODE_VERSION>/<CONTROLPLANE_VERSION>/
#     root/     the read-only lower layer of every node's overlay root: Debian's runc and the libraries it
#               links, Debian's static busybox as the node's shell and tools (init, mount, sysctl, ...),
#               containerd 2 and its runc shim, the CNI plugins, the kubelet of the local control plane
#     pause     the sandbox image's program (Go), pushed to the simulator's registry as the pause image
#     docker-registry  Debian's OCI registry (distribution), the registry the real nodes pull from
# and prints that directory as the last line on stdout. A run with the cache present is a no-op.
#
# containerd and the CNI plugins are built from Go modules (wrapper modules in hack/realnode/containerd and
# hack/realnode/cni, checksums committed), the Debian packages are unpacked by hack/debian/fetch.sh and
# hack/busybox/fetch.sh (nothing is installed on this machine). The kubelet comes from `make
# controlplane` (hack/controlplane/build.sh builds it with the other control-plane binaries).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
# shellcheck source=../controlplane/versions.env
. "$REPO/hack/controlplane/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[realnode %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

CP_CACHE=${NODEWRIGHT_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/controlplane}/$CONTROLPLANE_VERSION
KUBELET=$CP_CACHE/kubelet
[ -x "$KUBELET" ] || { log "no kubelet in $CP_CACHE: run 'make controlplane' first"; exit 1; }

# The Debian and busybox versions a build took are recorded in inputs.txt; bump REALNODE_LAYOUT (or
# remove the cache directory) to take newer ones.
CACHE_ROOT=${NODEWRIGHT_REALNODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/realnode}
OUT=$CACHE_ROOT/$REALNODE_VERSION/$CONTROLPLANE_VERSION
if [ -f "$OUT/.complete" ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi
debs=$(bash "$REPO/hack/debian/fetch.sh" realnode-debs $DEBIAN_PACKAGES | tail -n 1)
busybox=$(bash "$REPO/hack/busybox/fetch.sh" | tail -n 1)
registry=$(bash "$REPO/hack/debian/fetch.sh" registry docker-registry | tail -n 1)
command -v go >/dev/null || { log "Go is required (1.26+): install it and retry"; exit 1; }
start=$(date +%s)
BIN=$CACHE_ROOT/$REALNODE_VERSION/bin
mkdir -p "$BIN/cni"

if [ ! -x "$BIN/containerd" ] || [ ! -x "$BIN/containerd-shim-runc-v2" ]; then
  log "containerd $CONTAINERD_VERSION (first build: 2-4 min on 2 cores)"
  (cd "$HERE/containerd" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" -o "$BIN/" \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr)
fi
if [ ! -x "$BIN/cni/bridge" ] || [ ! -x "$BIN/cni/host-local" ] || [ ! -x "$BIN/cni/loopback" ]; then
  log "CNI plugins $CNI_PLUGINS_VERSION"
  (cd "$HERE/cni" && go build -trimpath -ldflags "-s -w" -o "$BIN/cni/" \
      github.com/containernetworking/plugins/plugins/main/bridge \
      github.com/containernetworking/plugins/plugins/ipam/host-local \
      github.com/containernetworking/plugins/plugins/main/loopback)
fi
if [ ! -x "$BIN/pause" ]; then
  log "pause"
  (cd "$HERE/pause" && go build -trimpath -ldflags "-s -w" -o "$BIN/pause" .)
fi

log "base root from $debs"
rm -rf "$OUT.partial" && mkdir -p "$OUT.partial/root"
root=$OUT.partial/root
cp -a "$debs/." "$root/"
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" "$root/usr/share/locale"
for d in bin sbin usr/bin usr/sbin usr/local/bin opt/cni/bin etc proc sys dev run tmp root var/lib var/log boot; do
  mkdir -p "$root/$d"
done
install -m 0755 "$busybox" "$root/bin/busybox"
# Every applet as a command, except those the box layer replaces (module loading: the box shares the
# machine's kernel) and those that would name the machine's disks.
for applet in $("$root/bin/busybox" --list); do
  case $applet in
    busybox | modprobe | insmod | rmmod | depmod | linuxrc | mdev | fdisk | mkswap | swapon | swapoff) continue ;;
  esac
  [ -e "$root/bin/$applet" ] || [ -e "$root/usr/sbin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
ln -sf ../bin/busybox "$root/sbin/init"
install -m 0755 "$BIN/containerd" "$BIN/containerd-shim-runc-v2" "$BIN/ctr" "$root/usr/local/bin/"
install -m 0755 "$BIN/cni/bridge" "$BIN/cni/host-local" "$BIN/cni/loopback" "$root/opt/cni/bin/"
install -m 0755 "$KUBELET" "$root/usr/local/bin/kubelet"
chmod 1777 "$root/tmp"
install -m 0755 "$BIN/pause" "$OUT.partial/pause"
install -m 0755 "$registry/usr/bin/docker-registry" "$OUT.partial/docker-registry"
printf 'debian %s\nbusybox %s\nkubelet %s\ncontainerd %s\ncni %s\n' "$debs" "$busybox" "$K8S_VERSION" \
  "$CONTAINERD_VERSION" "$CNI_PLUGINS_VERSION" > "$OUT.partial/inputs.txt"
date -u +%FT%TZ > "$OUT.partial/.complete"
rm -rf "$OUT" && mv "$OUT.partial" "$OUT"
log "done in $(( $(date +%s) - start ))s: $OUT"
echo "$OUT"
