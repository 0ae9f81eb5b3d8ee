#!/usr/bin/env bash
# Fetch programs from Debian packages into a version-keyed cache, without installing anything:
#   hack/debian/fetch.sh TOOL PACKAGE...
# downloads the packages with `apt-get download`, unpacks them with `dpkg-deb -x` into
#   ${NODEWRIGHT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright}/TOOL/<versions>/root/
# and prints that root directory as the last line on stdout. A run with the cache present is a no-op.
# Programs inside run with LD_LIBRARY_PATH=<root>/usr/lib/x86_64-linux-gnu (or the machine's multiarch
# directory) when a package ships a library next to its program (lua5.1 and liblua5.1-0).
# Used for the Lua interpreter of the Argo CD health tests (TOOL=lua), the OCI registry of the chart
# tests (TOOL=registry: Debian's docker-registry, i.e. distribution/distribution) and Prometheus
# (TOOL=prometheus: promtool for the alert-rule tests, prometheus for the dashboard-query test).
set -euo pipefail

TOOL=${1:?usage: hack/debian/fetch.sh TOOL PACKAGE...}
shift
[ $# -gt 0 ] || { echo "usage: hack/debian/fetch.sh TOOL PACKAGE..." >&2; exit 2; }
CACHE_ROOT=${NODEWRIGHT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright}/$TOOL

log() { printf '[%s %s] %s\n' "$TOOL" "$(date +%H:%M:%S)" "$*" >&2; }

for tool in apt-get apt-cache dpkg-deb; do
  command -v "$tool" >/dev/null || { log "$tool is required (a Debian or Ubuntu machine)"; exit 1; }
done

candidates() { apt-cache policy "$@" 2>/dev/null | awk '/^[^ ]/{p=$1} /Candidate:/{print p "@" $2}' | tr -d ':' ; }
key=$(candidates "$@" | tr '\n' '_' | sed 's/_$//')
if [ -z "$key" ] || [[ "$key" == *"(none)"* ]] || [ "$(candidates "$@" | wc -l)" -ne $# ]; then
  for cached in "$CACHE_ROOT"/*/root; do
    if [ -f "$cached/../.complete" ]; then
      log "cached: $cached (no package lists to compare versions with)"
      echo "$cached"
      exit 0
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    log "no package lists for $*: run 'apt-get update' as root"
    exit 1
  fi
  log "no package lists for $*: running apt-get update"
  apt-get update -qq >&2
  key=$(candidates "$@" | tr '\n' '_' | sed 's/_$//')
fi
out="$CACHE_ROOT/$key"
if [ -f "$out/.complete" ]; then
  log "cached: $out/root"
  echo "$out/root"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt downloads as its unprivileged `_apt` user when it can write the target directory.
if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$work"; fi
(cd "$work" && apt-get download "$@" >&2)
rm -rf "$out" && mkdir -p "$out/root"
for deb in "$work"/*.deb; do
  dpkg-deb --extract "$deb" "$out/root"
  dpkg-deb --field "$deb" Package Version | paste -sd' ' >> "$out/packages.txt"
done
date -u +%FT%TZ > "$out/.complete"
log "$(wc -l < "$out/packages.txt") package(s) in $out/root"
echo "$out/root"
