#!/usr/bin/env bash
# Fetch Debian's statically linked busybox (package busybox-static) for the agent's chroot tests.
#
# The tests build a tiny host root with a static shell inside it and chroot the agent's steps into it;
# a static binary needs no libraries in that root. The binary is taken from the Debian package with
# `apt-get download` (no install, nothing changes on this machine) and kept in a version-keyed cache:
#   ${NODEWRIGHT_BUSYBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/busybox}/<version>/busybox
# A run with a cached binary is a no-op. The last line printed on stdout is the binary's path.
set -euo pipefail

CACHE_ROOT=${NODEWRIGHT_BUSYBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright/busybox}
PACKAGE=busybox-static

log() { printf '[busybox %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

for cached in "$CACHE_ROOT"/*/busybox; do
  if [ -x "$cached" ]; then
    log "cached: $cached"
    echo "$cached"
    exit 0
  fi
done

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { log "$tool is required (a Debian or Ubuntu machine)"; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt downloads as its unprivileged `_apt` user when it can write the target directory.
if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$work"; fi
cd "$work"

if ! apt-get download "$PACKAGE" >&2; then
  # A fresh machine has no package lists yet: fetch them from the configured Debian mirror and retry.
  if [ "$(id -u)" -ne 0 ]; then
    log "apt-get download failed and refreshing the package lists needs root: run 'apt-get update' as root"
    exit 1
  fi
  log "apt-get download failed; running apt-get update and retrying"
  apt-get update -qq >&2
  apt-get download "$PACKAGE" >&2
fi

deb=$(find . -maxdepth 1 -name "${PACKAGE}_*.deb" | head -n 1)
[ -n "$deb" ] || { log "apt-get download produced no ${PACKAGE} .deb"; exit 1; }
version=$(dpkg-deb --field "$deb" Version)
version=${version#*:}   # drop the epoch ("1:1.35.0-4") so the directory name has no colon
dpkg-deb --extract "$deb" extracted
binary=""
for candidate in extracted/bin/busybox extracted/usr/bin/busybox; do
  [ -x "$candidate" ] && binary=$candidate && break
done
[ -n "$binary" ] || { log "no busybox binary in $deb"; exit 1; }
"$binary" true || { log "$binary does not run on this machine"; exit 1; }

out="$CACHE_ROOT/$version"
mkdir -p "$out"
install -m 0755 "$binary" "$out/busybox.partial"
mv -f "$out/busybox.partial" "$out/busybox"
log "busybox $version in $out"
echo "$out/busybox"
