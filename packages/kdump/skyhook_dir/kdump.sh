#!/bin/sh
# kdump: install kdump-tools on the node (apply, upgrade), write its configuration (apply, config,
# upgrade), or undo both (uninstall). Idempotent: files are replaced only when their content changes,
# and the boot loader configuration is regenerated only when crashkernel= changed. The reserved memory
# takes effect at the next boot: give the package a reboot interrupt (and a configInterrupt for
# `crashkernel`).
set -eu
. "${0%/*}/lib.sh"

CHANGED=

# put FILE CONTENT: make FILE (a host path) hold CONTENT; sets CHANGED when it did anything.
put() {
	if [ -f "$HOST$1" ] && [ "$(cat "$HOST$1")" = "$2" ]; then
		say "unchanged: $1"
		return 0
	fi
	mkdir -p "$HOST${1%/*}"
	printf '%s\n' "$2" >"$HOST$1.nodewright-tmp"
	mv -f "$HOST$1.nodewright-tmp" "$HOST$1"
	say "wrote $1"
	CHANGED="$CHANGED $1"
}

install_tools() {
	if ! on_node; then
		say "the node's root is $HOST, not /: kdump-tools is not installed here (only its configuration)"
		return 0
	fi
	if command -v kdump-config >/dev/null 2>&1; then
		say "kdump-tools is installed"
		return 0
	fi
	command -v apt-get >/dev/null 2>&1 ||
		fail "kdump-tools is not installed and this node has no apt-get: this package supports Debian and" \
			"Ubuntu nodes; install kdump-tools in the node image"
	say "installing kdump-tools"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends kdump-tools makedumpfile
	mkdir -p "$STATE_DIR"
	: >"$STATE_DIR/installed-kdump-tools"
}

configure() {
	read_settings
	mkdir -p "$HOST$COREDIR" "$HOST$STATE_DIR"
	# Keep the distribution's own defaults file once, to put it back on uninstall.
	if [ -f "$HOST$DEFAULTS_FILE" ] && ! ours "$DEFAULTS_FILE" && [ ! -e "$HOST$BACKUP_FILE" ]; then
		cp -p "$HOST$DEFAULTS_FILE" "$HOST$BACKUP_FILE"
		say "kept the original $DEFAULTS_FILE as $BACKUP_FILE"
	fi
	put "$DEFAULTS_FILE" "$(render_defaults)"
	put "$GRUB_FILE" "$(render_grub)"
	say "crashkernel=$CRASHKERNEL, dumps in $COREDIR"
}

unconfigure() {
	if [ -e "$HOST$GRUB_FILE" ]; then
		rm -f "$HOST$GRUB_FILE"
		say "removed $GRUB_FILE"
		CHANGED="$CHANGED $GRUB_FILE"
	fi
	if [ -f "$HOST$BACKUP_FILE" ]; then
		mv -f "$HOST$BACKUP_FILE" "$HOST$DEFAULTS_FILE"
		say "restored the original $DEFAULTS_FILE"
	elif ours "$DEFAULTS_FILE"; then
		rm -f "$HOST$DEFAULTS_FILE"
		say "removed $DEFAULTS_FILE"
	fi
	if on_node && [ -f "$STATE_DIR/installed-kdump-tools" ] && command -v apt-get >/dev/null 2>&1; then
		say "removing kdump-tools (this package installed it)"
		DEBIAN_FRONTEND=noninteractive apt-get remove -y kdump-tools
	fi
	rm -rf "$HOST$STATE_DIR"
	say "crash dumps already written stay in their directory; the reservation ends at the next reboot"
}

mode=${1:?usage: kdump.sh apply|config|upgrade|uninstall}
case $mode in
apply | upgrade)
	install_tools
	configure
	;;
config) configure ;;
uninstall) unconfigure ;;
*) fail "unknown mode '$mode' (apply, config, upgrade, uninstall)" ;;
esac
case " $CHANGED " in
*" $GRUB_FILE "*) regenerate_grub ;;
esac
