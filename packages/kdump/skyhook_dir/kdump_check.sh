#!/bin/sh
# kdump checks. apply, config, upgrade: the defaults file and the GRUB snippet hold exactly what the
# configMap gives, the dump directory exists, and on a node kdump-tools is installed. post-interrupt:
# the same, and the running kernel has it: the last crashkernel= of /proc/cmdline is the configured
# one, and where the node's /sys shows them, memory is reserved (/sys/kernel/kexec_crash_size > 0) and
# the crash kernel is loaded (/sys/kernel/kexec_crash_loaded = 1). uninstall: nothing of ours is left.
# Every difference is reported, then the check fails.
set -eu
. "${0%/*}/lib.sh"

FAILED=0
problem() {
	warn "$*"
	FAILED=1
}

check_file() {
	if [ ! -f "$HOST$1" ]; then
		problem "$1 is missing (config writes it)"
	elif [ "$(cat "$HOST$1")" != "$2" ]; then
		problem "$1 differs from what the configMap gives (changed by hand?)"
	else
		say "ok: $1"
	fi
}

check_configured() {
	read_settings
	check_file "$DEFAULTS_FILE" "$(render_defaults)"
	check_file "$GRUB_FILE" "$(render_grub)"
	if [ ! -d "$HOST$COREDIR" ]; then problem "the dump directory $COREDIR is missing"; fi
	if on_node && ! command -v kdump-config >/dev/null 2>&1; then
		problem "kdump-tools is not installed (no kdump-config)"
	fi
}

check_running() {
	if [ ! -f "$HOST/proc/cmdline" ]; then
		problem "cannot read the kernel command line: $HOST/proc/cmdline is missing"
		return 0
	fi
	_last=
	set -f
	# shellcheck disable=SC2013 # words, not lines
	for _word in $(cat "$HOST/proc/cmdline"); do
		case $_word in crashkernel=*) _last=$_word ;; esac
	done
	set +f
	if [ "$_last" != "crashkernel=$CRASHKERNEL" ]; then
		problem "the running kernel has '${_last:-no crashkernel=}', not crashkernel=$CRASHKERNEL (rebooted?)"
	fi
	_size_file="$HOST/sys/kernel/kexec_crash_size"
	if [ -f "$_size_file" ]; then
		if [ "$(cat "$_size_file")" -le 0 ]; then problem "no memory is reserved for the crash kernel ($_size_file)"; fi
	else
		say "this root has no /sys/kernel/kexec_crash_size: the reservation is not compared"
	fi
	_loaded_file="$HOST/sys/kernel/kexec_crash_loaded"
	if [ -f "$_loaded_file" ]; then
		if [ "$(cat "$_loaded_file")" != 1 ]; then problem "the crash kernel is not loaded ($_loaded_file)"; fi
	else
		say "this root has no /sys/kernel/kexec_crash_loaded: the loaded crash kernel is not compared"
	fi
}

mode=${1:?usage: kdump_check.sh apply|config|upgrade|post-interrupt|uninstall}
case $mode in
apply | config | upgrade) check_configured ;;
post-interrupt)
	check_configured
	check_running
	;;
uninstall)
	if [ -e "$HOST$GRUB_FILE" ]; then problem "$GRUB_FILE is still there"; fi
	if ours "$DEFAULTS_FILE"; then problem "$DEFAULTS_FILE is still the package's"; fi
	if [ -e "$HOST$BACKUP_FILE" ]; then problem "$BACKUP_FILE was not put back"; fi
	if [ -e "$HOST$STATE_DIR" ]; then problem "$STATE_DIR is still there"; fi
	;;
*) fail "unknown mode '$mode' (apply, config, upgrade, post-interrupt, uninstall)" ;;
esac
[ "$FAILED" -ne 0 ] || say "$mode check passed"
exit "$FAILED"
