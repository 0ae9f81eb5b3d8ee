#!/bin/sh
# eks-node-init checks. apply, config, upgrade: kernel installed (image and modules), the boot loader's
# default is it, EFA installed at the configured version, its module listed for boot and loaded, the
# EFA devices and libfabric's efa provider present. post-interrupt: the same, and the running kernel is
# the pinned one. uninstall: nothing of the package is left. Every difference is reported, then the
# check fails.
#
# Reading back: the running kernel from /proc/sys/kernel/osrelease (what `uname -r` prints), modules
# from /proc/modules, devices from /sys/class/infiniband/*/device/driver, the boot default from grubby
# --default-kernel (Amazon Linux) or GRUB_DEFAULT as update-grub reads /etc/default/grub(.d) and, where
# it exists, /boot/grub/grub.cfg (Ubuntu); all under the node's root (NODEWRIGHT_HOST_ROOT).
set -eu
. "${0%/*}/lib.sh"

FAILED=0
PROBLEMS=""
problem() {
	warn "$*"
	FAILED=1
	PROBLEMS="${PROBLEMS:+$PROBLEMS; }$*"
}

check_kernel() {
	if [ ! -f "$HOST/boot/vmlinuz-$KERNEL" ]; then
		problem "kernel $KERNEL is not installed: /boot/vmlinuz-$KERNEL is missing"
	elif [ ! -d "$HOST/lib/modules/$KERNEL" ]; then
		problem "kernel $KERNEL has no modules: /lib/modules/$KERNEL is missing"
	else
		say "ok: kernel $KERNEL is installed"
	fi
	if [ "$FAMILY" = rpm ]; then
		if ! _grubby=$(tool grubby); then
			problem "cannot ask the node's grubby for the boot default (no grubby on this node's tools)"
			return 0
		fi
		_default=$("$_grubby" --default-kernel) || _default="(grubby failed)"
		if [ "$_default" != "/boot/vmlinuz-$KERNEL" ]; then
			problem "the boot loader's default is $_default, not /boot/vmlinuz-$KERNEL (grubby --default-kernel)"
		else
			say "ok: the boot loader's default is kernel $KERNEL"
		fi
		return 0
	fi
	if [ ! -f "$HOST$GRUB_FILE" ]; then
		problem "$GRUB_FILE is missing (config writes it)"
	elif [ "$(cat "$HOST$GRUB_FILE")" != "$(render_grub)" ]; then
		problem "$GRUB_FILE differs from what kernel=$KERNEL gives (changed by hand?)"
	fi
	_effective=$(effective_grub_default)
	if [ "$_effective" != "$(grub_entry)" ]; then
		problem "GRUB_DEFAULT is '$_effective' after /etc/default/grub and grub.d/*.cfg, not '$(grub_entry)'"
	elif [ -f "$HOST/boot/grub/grub.cfg" ] && ! grep -qF "with Linux $KERNEL'" "$HOST/boot/grub/grub.cfg"; then
		problem "/boot/grub/grub.cfg has no entry for kernel $KERNEL: update-grub has not run since it was installed"
	else
		say "ok: GRUB boots kernel $KERNEL by default"
	fi
}

check_running_kernel() {
	_running=$(running_kernel)
	if [ "$_running" != "$KERNEL" ]; then
		problem "the running kernel is ${_running:-unknown} (uname -r), not $KERNEL"
	else
		say "ok: the running kernel is $KERNEL"
	fi
}

check_efa() {
	if [ "$EFA" = none ]; then
		if ours "$MODULES_FILE"; then problem "$MODULES_FILE is still there, but efa=none"; fi
		return 0
	fi
	_installed=$(installed_efa)
	if [ "$_installed" != "$EFA" ]; then
		problem "EFA is $_installed ($EFA_PACKAGES_FILE), not the installer $EFA"
	else
		say "ok: the EFA installer $EFA's packages are installed"
	fi
	if [ ! -f "$HOST$MODULES_FILE" ] || [ "$(cat "$HOST$MODULES_FILE")" != "$(render_modules)" ]; then
		problem "$MODULES_FILE does not load efa at boot (missing or changed)"
	fi
	if efa_loaded; then say "ok: the efa module is loaded"; else problem "the efa module is not loaded (/proc/modules)"; fi
	if [ "$EFA_DEVICES" -eq 0 ]; then
		say "efa-devices 0: the EFA devices and libfabric's efa provider (which needs one) are not compared"
		return 0
	fi
	_devices=$(efa_devices)
	if [ "$_devices" -lt "$EFA_DEVICES" ]; then
		problem "$_devices EFA devices in /sys/class/infiniband, expected at least $EFA_DEVICES (efa-devices)"
	else
		say "ok: $_devices EFA devices"
	fi
	if efa_provider; then
		say "ok: libfabric's efa provider answers ($FI_INFO -p efa -t FI_EP_RDM)"
	else
		problem "libfabric has no efa provider: $FI_INFO -p efa -t FI_EP_RDM does not list one"
	fi
}

check_uninstalled() {
	for _file in "$GRUB_FILE" "$MODULES_FILE"; do
		if ours "$_file"; then problem "$_file is still there"; fi
	done
	if [ -e "$HOST$STATE_DIR" ]; then problem "$STATE_DIR is still there"; fi
}

mode=${1:?usage: node_init_check.sh apply|config|upgrade|post-interrupt|uninstall}
case $mode in
apply | config | upgrade | post-interrupt)
	read_settings
	detect_os
	check_kernel
	if [ "$mode" = post-interrupt ]; then check_running_kernel; fi
	check_efa
	[ "$FAILED" -ne 0 ] || say "the node has kernel $KERNEL$([ "$mode" != post-interrupt ] || printf ' running') and EFA $EFA"
	;;
uninstall) check_uninstalled ;;
*) fail "unknown mode '$mode' (apply, config, upgrade, post-interrupt, uninstall)" ;;
esac
# The differences again, last: what an operator shows of a failed check is the end of its output.
[ "$FAILED" -eq 0 ] || warn "check failed: $PROBLEMS"
exit "$FAILED"
