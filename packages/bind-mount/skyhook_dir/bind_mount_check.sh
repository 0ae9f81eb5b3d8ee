#!/bin/sh
# bind-mount checks. apply, config, upgrade: source and target directories exist, and each mount is
# written exactly as configured (its unit and enablement link, or the package's /etc/fstab block), with
# nothing left of mounts no longer configured. post-interrupt: the same, and each target is a mount
# point of the running node: it appears in /proc/1/mountinfo, the mount table of the node's init (the
# package pod shares the host's PID namespace, so this is the host's table, not the pod's). A root
# without /proc/1/mountinfo (a simulated node) has no mount table to compare, which is reported.
# uninstall: no unit with the package's header, no dangling enablement link, no fstab block.
set -eu
. "${0%/*}/lib.sh"

FAILED=0
problem() {
	warn "$*"
	FAILED=1
}

check_written() {
	read_mounts
	while read -r source target options; do
		[ -n "$source" ] || continue
		[ -d "$HOST$source" ] || problem "source directory $source is missing"
		[ -d "$HOST$target" ] || problem "target directory $target is missing"
		[ "$METHOD" = systemd ] || continue
		unit=$(unit_name "$target")
		if [ ! -f "$HOST$UNIT_DIR/$unit" ]; then
			problem "$UNIT_DIR/$unit is missing"
		elif [ "$(cat "$HOST$UNIT_DIR/$unit")" != "$(render_unit "$source" "$target" "$options")" ]; then
			problem "$UNIT_DIR/$unit differs from the configured mount of $source at $target"
		fi
		if [ "$(readlink "$HOST$WANTS_DIR/$unit" 2>/dev/null || true)" != "$UNIT_DIR/$unit" ]; then
			problem "$unit is not enabled: $WANTS_DIR/$unit is not a link to $UNIT_DIR/$unit"
		fi
	done <<LIST
$MOUNTS
LIST
	if [ "$(managed_units)" != "$(expected_units)" ]; then
		problem "the units written ($(managed_units | tr '\n' ' ')) are not the configured ones"
	fi
	if [ "$METHOD" = fstab ]; then
		[ "$(fstab_block)" = "$(render_fstab_block)" ] || problem "$FSTAB does not hold the configured block"
	else
		[ -z "$(fstab_block)" ] || problem "$FSTAB still has the package's block (method is systemd)"
	fi
}

check_mounted() {
	table="$HOST/proc/1/mountinfo"
	if [ ! -f "$table" ]; then
		say "this root has no /proc/1/mountinfo: the running node's mounts are not compared"
		return 0
	fi
	while read -r source target options; do
		[ -n "$source" ] || continue
		found=0
		while read -r _id _parent _device _root point _rest; do
			if [ "$point" = "$target" ]; then found=1; fi
		done <"$table"
		[ "$found" -eq 1 ] || problem "$target is not mounted on the running node (interrupt or reboot done?)"
	done <<LIST
$MOUNTS
LIST
}

check_removed() {
	for unit in "$HOST$UNIT_DIR"/*.mount; do
		[ -f "$unit" ] || continue
		IFS= read -r first <"$unit" || true
		case $first in "# Written by the NodeWright bind-mount package"*) problem "${unit#"$HOST"} is still there" ;; esac
	done
	for link in "$HOST$WANTS_DIR"/*.mount; do
		[ -L "$link" ] || continue
		target=$(readlink "$link")
		[ -e "$HOST$target" ] || problem "${link#"$HOST"} points to the removed $target"
	done
	[ -z "$(fstab_block)" ] || problem "$FSTAB still has the package's block"
	[ ! -e "$HOST$STATE_DIR" ] || problem "$STATE_DIR is still there"
}

mode=${1:?usage: bind_mount_check.sh apply|config|upgrade|post-interrupt|uninstall}
case $mode in
apply | config | upgrade) check_written ;;
post-interrupt)
	check_written
	check_mounted
	;;
uninstall) check_removed ;;
*) fail "unknown mode '$mode' (apply, config, upgrade, post-interrupt, uninstall)" ;;
esac
[ "$FAILED" -ne 0 ] || say "$mode check passed"
exit "$FAILED"
