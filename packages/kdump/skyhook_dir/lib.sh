# kdump: shared by kdump.sh and kdump_check.sh (sourced). POSIX sh; runs under dash, bash and busybox.
#
# Configures the kernel crash dump collector of Debian and Ubuntu (kdump-tools): memory reserved for
# the crash kernel (crashkernel= on the kernel command line, through /etc/default/grub.d) and
# /etc/default/kdump-tools. ConfigMap keys: `crashkernel` (required), `coredir` and `num_dumps`
# (optional), or `kdump-tools` (optional: the whole defaults file, instead of coredir and num_dumps).

# The node's root as the step sees it: "" for / (on a node the agent chroots into the host's /), else
# the directory standing for the node (nodewright package run, the simulator).
HOST="${NODEWRIGHT_HOST_ROOT:-/}"
HOST="${HOST%/}"
CONFIGMAPS="${SKYHOOK_DIR:?SKYHOOK_DIR is not set: run this step through the NodeWright agent}/configmaps"
DEFAULTS_FILE=/etc/default/kdump-tools
BACKUP_FILE=/etc/default/kdump-tools.nodewright-orig
# Read after a distribution's /etc/default/grub.d/kdump-tools.cfg (glob order), so ours is the last word.
GRUB_FILE=/etc/default/grub.d/zz-nodewright-kdump.cfg
STATE_DIR=/var/lib/nodewright-kdump
MARKER="# Written by the NodeWright kdump package"
DEFAULT_COREDIR=/var/crash
DEFAULT_NUM_DUMPS=3

say() { printf 'kdump: %s\n' "$*"; }
warn() { printf 'kdump: %s\n' "$*" >&2; }
fail() {
	warn "$*"
	exit 1
}

# given KEY: the configMap has KEY.
given() { [ -f "$CONFIGMAPS/$1" ]; }

# configured KEY DEFAULT: the configMap value of KEY as one word (surrounding blanks dropped), or DEFAULT.
configured() {
	if ! given "$1"; then
		printf '%s' "$2"
		return 0
	fi
	_key=$1
	set -f
	# shellcheck disable=SC2046 # word splitting is the point
	set -- $(cat "$CONFIGMAPS/$_key")
	set +f
	[ $# -eq 1 ] || fail "configMap key '$_key' must be one word, not '$*'"
	printf '%s' "$1"
}

read_settings() {
	given crashkernel ||
		fail "the package's configMap has no 'crashkernel' key; set it, e.g. 512M or 2G-64G:512M,64G-:1G"
	CRASHKERNEL=$(configured crashkernel "")
	case $CRASHKERNEL in
	'' | *[!0-9A-Za-z,:@-]*)
		fail "crashkernel '$CRASHKERNEL' may only use digits, letters and , : @ - (e.g. 512M or 2G-64G:512M)"
		;;
	*[0-9][KMGkmg]*) ;;
	*) fail "crashkernel '$CRASHKERNEL' names no size such as 512M (crashkernel=auto is not supported here)" ;;
	esac
	CUSTOM_DEFAULTS=
	if given kdump-tools; then
		CUSTOM_DEFAULTS="$CONFIGMAPS/kdump-tools"
		for _key in coredir num_dumps; do
			if given "$_key"; then
				fail "the configMap gives both 'kdump-tools' (the whole file) and '$_key': keep one of them"
			fi
		done
		# The dump directory the given file names (the last KDUMP_COREDIR= line, quotes dropped).
		COREDIR=$DEFAULT_COREDIR
		while IFS= read -r _line || [ -n "$_line" ]; do
			case $_line in
			KDUMP_COREDIR=*)
				COREDIR=${_line#KDUMP_COREDIR=}
				COREDIR=${COREDIR#[\"\']}
				COREDIR=${COREDIR%[\"\']}
				;;
			esac
		done <"$CUSTOM_DEFAULTS"
	else
		COREDIR=$(configured coredir "$DEFAULT_COREDIR")
		NUM_DUMPS=$(configured num_dumps "$DEFAULT_NUM_DUMPS")
		case $NUM_DUMPS in '' | *[!0-9]*) fail "num_dumps '$NUM_DUMPS' must be a whole number (0 keeps every dump)" ;; esac
	fi
	case $COREDIR in
	/*) ;;
	*) fail "coredir '$COREDIR' must be an absolute path" ;;
	esac
	case $COREDIR in
	*[!A-Za-z0-9/._-]* | */../* | */.. | / | //*)
		fail "coredir '$COREDIR' must be a plain absolute directory (letters, digits, / . _ -), not /"
		;;
	esac
}

render_defaults() {
	printf '%s (config mode); restored on uninstall from %s.\n' "$MARKER" "$BACKUP_FILE"
	printf "# Change the package's configMap, not this file: the package's checks fail on any change.\n"
	if [ -n "$CUSTOM_DEFAULTS" ]; then
		cat "$CUSTOM_DEFAULTS"
	else
		printf 'USE_KDUMP=1\nKDUMP_COREDIR="%s"\nKDUMP_NUM_DUMPS=%s\n' "$COREDIR" "$NUM_DUMPS"
	fi
}

render_grub() {
	cat <<EOF
$MARKER: reserve memory for the crash kernel (see $DEFAULTS_FILE).
# Every other crashkernel= is dropped from the command line, so the kernel sees exactly this one.
_nodewright_no_crashkernel() {
	set -f
	_nodewright_kept=
	for _nodewright_word in \$1; do
		case \$_nodewright_word in crashkernel=*) ;; *) _nodewright_kept="\$_nodewright_kept \$_nodewright_word" ;; esac
	done
	printf '%s' "\${_nodewright_kept# }"
}
GRUB_CMDLINE_LINUX="\$(_nodewright_no_crashkernel "\$GRUB_CMDLINE_LINUX")"
GRUB_CMDLINE_LINUX_DEFAULT="\$(_nodewright_no_crashkernel "\$GRUB_CMDLINE_LINUX_DEFAULT") crashkernel=$CRASHKERNEL"
unset -f _nodewright_no_crashkernel
EOF
}

# ours FILE: FILE (a host path) was written by this package.
ours() {
	[ -f "$HOST$1" ] || return 1
	IFS= read -r _first <"$HOST$1" || true
	case $_first in "$MARKER"*) return 0 ;; *) return 1 ;; esac
}

# on_node: the step runs on the node itself (not against a directory standing for one).
on_node() { [ -z "$HOST" ]; }

regenerate_grub() {
	if ! on_node; then
		say "the node's root is $HOST, not /: boot loader configuration not regenerated here"
		return 0
	fi
	if command -v update-grub >/dev/null 2>&1; then
		update-grub
	elif command -v grub-mkconfig >/dev/null 2>&1 && [ -f /boot/grub/grub.cfg ]; then
		grub-mkconfig -o /boot/grub/grub.cfg
	else
		warn "warning: no update-grub or grub-mkconfig on this node: $GRUB_FILE takes effect only where the" \
			"boot loader reads /etc/default/grub.d (Debian, Ubuntu); post-interrupt-check reads the command line back"
	fi
}
