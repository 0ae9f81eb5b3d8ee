#!/bin/sh
# tuning checks. apply, config, upgrade: the three files hold exactly what the intent gives.
# post-interrupt: the same, and the running node has the values (read back below). uninstall: the files
# are gone. Every difference is reported, then the check fails.
#
# Reading values back: sysctl values from /proc/sys/<key with dots as slashes> and the kernel command
# line from /proc/cmdline, both under the node's root. On a node that is the running kernel's procfs
# (what `sysctl -n` and `cat /proc/cmdline` read); on a simulated node it is the files the simulated
# boot wrote from /etc/sysctl.d and /etc/default/grub.d. Power settings are compared in every sysfs file
# of the setting that exists in the root; a node without them (a VM without cpufreq, a simulated root)
# has nothing to compare, which is reported, not failed.
#
# On Container-Optimized OS (cos.sh) there are no files: every mode but uninstall compares the running
# values with the intent, and uninstall checks that the package's records are gone.
set -eu
. "${0%/*}/lib.sh"
. "${0%/*}/cos.sh"

FAILED=0
PROBLEMS=""
problem() {
	warn "$*"
	FAILED=1
	PROBLEMS="${PROBLEMS:+$PROBLEMS; }$*"
}

check_file() {
	_content=$(expected "$1")
	if [ -z "$_content" ]; then
		if [ -e "$HOST$1" ]; then problem "$1 exists but the intent has nothing of its kind"; fi
	elif [ ! -f "$HOST$1" ]; then
		problem "$1 is missing (config writes it)"
	elif [ "$(cat "$HOST$1")" != "$_content" ]; then
		problem "$1 differs from what $INTENT gives (changed by hand?)"
	else
		say "ok: $1"
	fi
}

check_sysctl_values() {
	while read -r _kind _key _value; do
		[ "$_kind" = sysctl ] || continue
		_proc="$HOST/proc/sys/$(key_path "$_key")"
		if [ ! -f "$_proc" ]; then
			problem "sysctl $_key: $_proc does not exist (a key this kernel does not know?)"
			continue
		fi
		_running=$(words "$(cat "$_proc")")
		if [ "$_running" != "$(words "$_value")" ]; then
			problem "sysctl $_key is '$_running' on the running node, not '$_value'"
		fi
	done <<LIST
$ENTRIES
LIST
}

check_cmdline() {
	[ "$(count grub)" -gt 0 ] || return 0
	if [ ! -f "$HOST/proc/cmdline" ]; then
		problem "cannot read the kernel command line: $HOST/proc/cmdline is missing"
		return 0
	fi
	_cmdline=$(cat "$HOST/proc/cmdline")
	for _wanted in $(kernel_parameters); do
		_name=${_wanted%%=*}
		_last=
		set -f
		for _word in $_cmdline; do
			case $_word in "$_name" | "$_name="*) _last=$_word ;; esac
		done
		set +f
		if [ "$_last" != "$_wanted" ]; then
			problem "kernel parameter $_wanted is not in effect (the command line has '${_last:-nothing}' for $_name)"
		fi
	done
}

check_power_values() {
	while read -r _kind _key _value; do
		[ "$_kind" = power ] || continue
		_seen=0
		for _file in "$HOST"$(power_path "$_key"); do
			[ -f "$_file" ] || continue
			_seen=$((_seen + 1))
			_running=$(sysfs_value "$_file")
			if [ "$_running" != "$_value" ]; then problem "power $_key is '$_running' in $_file, not '$_value'"; fi
		done
		if [ "$_seen" -eq 0 ]; then say "power $_key: this node exposes no $(power_path "$_key"); not compared"; fi
	done <<LIST
$ENTRIES
LIST
}

# check_cos MODE: the Container-Optimized OS checks.
check_cos() {
	case $1 in
	uninstall)
		if [ -e "$HOST$COS_STATE" ]; then problem "$COS_STATE is still there (uninstall restores and removes it)"; fi
		;;
	*)
		read_intent
		assemble
		cos_intent
		check_sysctl_values
		check_power_values
		if [ ! -f "$HOST$COS_APPLIED" ]; then problem "$COS_APPLIED is missing: config has not run on this node"; fi
		if [ "$FAILED" -ne 0 ]; then
			warn "$COS_REAPPLY"
		else
			say "the running node has every value of $INTENT (Container-Optimized OS)"
		fi
		;;
	esac
}

mode=${1:?usage: tuning_check.sh apply|config|upgrade|post-interrupt|uninstall}
case $mode in
apply | config | upgrade | post-interrupt | uninstall)
	if on_cos; then
		check_cos "$mode"
		[ "$FAILED" -eq 0 ] || warn "check failed: $PROBLEMS"
		exit "$FAILED"
	fi
	;;
esac
case $mode in
apply | config | upgrade | post-interrupt)
	read_intent
	assemble
	check_file "$SYSCTL_FILE"
	check_file "$GRUB_FILE"
	check_file "$POWER_FILE"
	if [ "$mode" = post-interrupt ]; then
		check_sysctl_values
		check_cmdline
		check_power_values
		[ "$FAILED" -ne 0 ] || say "the running node has every value of $INTENT"
	fi
	;;
uninstall)
	for file in "$SYSCTL_FILE" "$GRUB_FILE" "$POWER_FILE"; do
		if [ -e "$HOST$file" ]; then problem "$file is still there"; fi
	done
	;;
*) fail "unknown mode '$mode' (apply, config, upgrade, post-interrupt, uninstall)" ;;
esac
# The differences again, last: what an operator shows of a failed check is the end of its output.
[ "$FAILED" -eq 0 ] || warn "check failed: $PROBLEMS"
exit "$FAILED"
