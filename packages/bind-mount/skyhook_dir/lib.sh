# bind-mount: shared by bind_mount.sh and bind_mount_check.sh (sourced). POSIX sh; dash, bash, busybox.
#
# ConfigMap keys: `mounts` (required): one bind mount per line, "SOURCE TARGET [OPTIONS]" (absolute
# paths; OPTIONS a comma-separated list added to "bind", e.g. ro or nofail; # starts a comment);
# `method` (optional): `systemd` (default: one .mount unit per target, enabled for local-fs.target) or
# `fstab` (a block of lines in /etc/fstab between the package's markers).

# The node's root as the step sees it: "" for / (on a node the agent chroots into the host's /), else
# the directory standing for the node (nodewright package run, the simulator).
HOST="${NODEWRIGHT_HOST_ROOT:-/}"
HOST="${HOST%/}"
CONFIGMAPS="${SKYHOOK_DIR:?SKYHOOK_DIR is not set: run this step through the NodeWright agent}/configmaps"
UNIT_DIR=/etc/systemd/system
WANTS_DIR=/etc/systemd/system/local-fs.target.wants
FSTAB=/etc/fstab
STATE_DIR=/var/lib/nodewright-bind-mount
UNITS_FILE=$STATE_DIR/units
BEGIN_MARK="# BEGIN NodeWright bind-mount package (managed: changes here are overwritten)"
END_MARK="# END NodeWright bind-mount package"

say() { printf 'bind-mount: %s\n' "$*"; }
warn() { printf 'bind-mount: %s\n' "$*" >&2; }
fail() {
	warn "$*"
	exit 1
}

# check_path WHAT PATH LINE: a normalized absolute path of plain characters (so it needs no escaping in
# fstab or unit files), not / and not below /proc, /sys or /dev.
check_path() {
	case $2 in
	/*) ;;
	*) fail "mounts line $3: $1 '$2' must be an absolute path" ;;
	esac
	case $2 in
	/ | */ | *//* | */./* | */. | */../* | */..)
		fail "mounts line $3: $1 '$2' must be a normalized path (no trailing /, no //, . or ..), not /"
		;;
	*[!A-Za-z0-9/._:+@-]*)
		fail "mounts line $3: $1 '$2' may only use letters, digits and / . _ : + @ -"
		;;
	/proc | /proc/* | /sys | /sys/* | /dev | /dev/*)
		fail "mounts line $3: $1 '$2' is in a kernel file system (/proc, /sys, /dev)"
		;;
	esac
}

# read_mounts: MOUNTS ("SOURCE TARGET OPTIONS" lines, validated) and METHOD from the configMap.
read_mounts() {
	[ -f "$CONFIGMAPS/mounts" ] ||
		fail "the package's configMap has no 'mounts' key; give lines 'SOURCE TARGET [OPTIONS]'"
	METHOD=systemd
	if [ -f "$CONFIGMAPS/method" ]; then
		set -f
		# shellcheck disable=SC2046 # word splitting drops surrounding blanks
		set -- $(cat "$CONFIGMAPS/method")
		set +f
		METHOD="$*"
		case $METHOD in
		systemd | fstab) ;;
		*) fail "configMap key 'method' is '$METHOD'; use systemd or fstab" ;;
		esac
	fi
	MOUNTS=
	_targets=" "
	_number=0
	while read -r _source _target _options _extra || [ -n "${_source:-}" ]; do
		_number=$((_number + 1))
		case $_source in '' | '#'*) continue ;; esac
		[ -n "$_target" ] || fail "mounts line $_number: '$_source' has no target; write 'SOURCE TARGET [OPTIONS]'"
		[ -z "${_extra:-}" ] || fail "mounts line $_number: too many fields; write 'SOURCE TARGET [OPTIONS]'"
		check_path source "$_source" "$_number"
		check_path target "$_target" "$_number"
		[ "$_source" != "$_target" ] || fail "mounts line $_number: $_source is mounted onto itself"
		case $_targets in *" $_target "*) fail "mounts line $_number: $_target is a target twice" ;; esac
		_targets="$_targets$_target "
		case ${_options:-} in
		*[!A-Za-z0-9,=._-]*) fail "mounts line $_number: options '$_options' may only use letters, digits and , = . _ -" ;;
		esac
		_options=${_options:+bind,$_options}
		MOUNTS="$MOUNTS${_source} ${_target} ${_options:-bind}
"
	done <"$CONFIGMAPS/mounts"
	[ -n "$MOUNTS" ] || fail "configMap key 'mounts' lists no mount"
}

# unit_name TARGET: the mount unit systemd runs for TARGET (systemd-escape --path --suffix=mount).
unit_name() {
	_rest=${1#/}
	_name=
	while [ -n "$_rest" ]; do
		_char=${_rest%"${_rest#?}"}
		_rest=${_rest#?}
		case $_char in
		/) _name="$_name-" ;;
		-) _name="$_name\\x2d" ;;
		+) _name="$_name\\x2b" ;;
		@) _name="$_name\\x40" ;;
		.) if [ -z "$_name" ]; then _name="\\x2e"; else _name="$_name."; fi ;;
		*) _name="$_name$_char" ;;
		esac
	done
	printf '%s.mount' "$_name"
}

render_unit() { # SOURCE TARGET OPTIONS
	printf '# Written by the NodeWright bind-mount package; removed by its uninstall.\n'
	printf '[Unit]\nDescription=Bind mount of %s at %s (NodeWright bind-mount package)\n' "$1" "$2"
	printf 'RequiresMountsFor=%s\n\n[Mount]\nWhat=%s\nWhere=%s\nType=none\nOptions=%s\n\n' "$1" "$1" "$2" "$3"
	printf '[Install]\nWantedBy=local-fs.target\n'
}

# expected_units: the unit names the configMap gives (systemd method), one per line.
expected_units() {
	[ "$METHOD" = systemd ] || return 0
	while read -r _source _target _options; do
		if [ -n "$_source" ]; then printf '%s\n' "$(unit_name "$_target")"; fi
	done <<EOF
$MOUNTS
EOF
}

render_fstab_block() {
	printf '%s\n' "$BEGIN_MARK"
	while read -r _source _target _options; do
		if [ -n "$_source" ]; then printf '%s %s none %s 0 0\n' "$_source" "$_target" "$_options"; fi
	done <<EOF
$MOUNTS
EOF
	printf '%s\n' "$END_MARK"
}

# fstab_without_block: /etc/fstab without the package's block.
fstab_without_block() {
	[ -f "$HOST$FSTAB" ] || return 0
	_inside=0
	while IFS= read -r _line || [ -n "$_line" ]; do
		if [ "$_line" = "$BEGIN_MARK" ]; then
			_inside=1
		elif [ "$_inside" -eq 1 ]; then
			if [ "$_line" = "$END_MARK" ]; then _inside=0; fi
		else
			printf '%s\n' "$_line"
		fi
	done <"$HOST$FSTAB"
}

# fstab_block: the package's block as it is in /etc/fstab (empty when there is none).
fstab_block() {
	[ -f "$HOST$FSTAB" ] || return 0
	_inside=0
	while IFS= read -r _line || [ -n "$_line" ]; do
		if [ "$_line" = "$BEGIN_MARK" ]; then _inside=1; fi
		if [ "$_inside" -eq 1 ]; then printf '%s\n' "$_line"; fi
		if [ "$_line" = "$END_MARK" ]; then _inside=0; fi
	done <"$HOST$FSTAB"
}

# managed_units: the units an earlier run wrote (from the package's state file).
managed_units() {
	if [ -f "$HOST$UNITS_FILE" ]; then cat "$HOST$UNITS_FILE"; fi
}
