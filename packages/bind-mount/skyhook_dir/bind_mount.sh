#!/bin/sh
# bind-mount: write the configured bind mounts as systemd mount units or /etc/fstab lines (apply,
# config, upgrade), or remove them (uninstall). Idempotent: files are replaced only when their content
# changes; units and lines of mounts no longer configured are removed. Nothing is mounted here (a
# package pod has its own mount namespace): the package's interrupt activates the mounts, a service
# restart of their units (`systemctl daemon-reload` then `systemctl restart <unit>`) or a reboot.
set -eu
. "${0%/*}/lib.sh"

# put FILE CONTENT: make FILE (a host path) hold CONTENT.
put() {
	if [ -f "$HOST$1" ] && [ "$(cat "$HOST$1")" = "$2" ]; then
		say "unchanged: $1"
		return 0
	fi
	mkdir -p "$HOST${1%/*}"
	printf '%s\n' "$2" >"$HOST$1.nodewright-tmp"
	mv -f "$HOST$1.nodewright-tmp" "$HOST$1"
	say "wrote $1"
}

# drop_unit NAME: remove a unit this package wrote, and its enablement.
drop_unit() {
	if [ -e "$HOST$UNIT_DIR/$1" ] || [ -L "$HOST$WANTS_DIR/$1" ]; then
		rm -f "$HOST$UNIT_DIR/$1" "$HOST$WANTS_DIR/$1"
		say "removed $UNIT_DIR/$1"
	fi
}

drop_fstab_block() {
	if [ -n "$(fstab_block)" ]; then
		put "$FSTAB" "$(fstab_without_block)"
		say "removed the package's lines from $FSTAB"
	fi
}

write_systemd() {
	wanted=$(expected_units)
	while read -r source target options; do
		[ -n "$source" ] || continue
		unit=$(unit_name "$target")
		put "$UNIT_DIR/$unit" "$(render_unit "$source" "$target" "$options")"
		mkdir -p "$HOST$WANTS_DIR"
		if [ "$(readlink "$HOST$WANTS_DIR/$unit" 2>/dev/null || true)" != "$UNIT_DIR/$unit" ]; then
			rm -f "$HOST$WANTS_DIR/$unit"
			ln -s "$UNIT_DIR/$unit" "$HOST$WANTS_DIR/$unit"
			say "enabled $unit (local-fs.target wants it)"
		fi
	done <<LIST
$MOUNTS
LIST
	for unit in $(managed_units); do
		case "
$wanted
" in *"
$unit
"*) ;; *) drop_unit "$unit" ;; esac
	done
	mkdir -p "$HOST$STATE_DIR"
	put "$UNITS_FILE" "$wanted"
	drop_fstab_block
}

write_fstab() {
	kept=$(fstab_without_block)
	put "$FSTAB" "${kept:+$kept
}$(render_fstab_block)"
	for unit in $(managed_units); do drop_unit "$unit"; done
	mkdir -p "$HOST$STATE_DIR"
	put "$UNITS_FILE" ""
}

mode=${1:?usage: bind_mount.sh apply|config|upgrade|uninstall}
case $mode in
apply | config | upgrade)
	read_mounts
	units=
	while read -r source target options; do
		[ -n "$source" ] || continue
		mkdir -p "$HOST$source" "$HOST$target"
		units="$units $(unit_name "$target")"
	done <<LIST
$MOUNTS
LIST
	if [ "$METHOD" = systemd ]; then write_systemd; else write_fstab; fi
	say "activate with the package's interrupt: a service restart of$units, or a reboot"
	;;
uninstall)
	for unit in $(managed_units); do drop_unit "$unit"; done
	drop_fstab_block
	rm -rf "$HOST$STATE_DIR"
	say "mounts that are active stay until they are stopped or the node reboots"
	;;
*) fail "unknown mode '$mode' (apply, config, upgrade, uninstall)" ;;
esac
