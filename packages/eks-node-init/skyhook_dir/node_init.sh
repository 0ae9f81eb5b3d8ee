#!/bin/sh
# eks-node-init: pin the kernel and install the EFA driver (apply, config, upgrade), or put back what the
# node had (uninstall). Idempotent: the kernel is installed only when its image is missing, the boot
# default set only when it points elsewhere, the EFA installer run only when another version (or none)
# is installed, files rewritten only when their content changes. The new kernel runs after the
# package's reboot interrupt; post-interrupt-check reads it back.
set -eu
. "${0%/*}/lib.sh"

CHANGED=

# put FILE CONTENT: make FILE (a host path) hold CONTENT; adds FILE to CHANGED when it did anything.
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

# remove_ours FILE: remove FILE if this package wrote it.
remove_ours() {
	if ours "$1"; then
		rm -f "$HOST$1"
		say "removed $1"
		CHANGED="$CHANGED $1"
	fi
}

# record FILE TEXT: write TEXT to FILE (a host path under STATE_DIR) unless FILE exists: a record of
# what the node had is taken once, before the first change.
record() {
	[ ! -e "$HOST$1" ] || return 0
	mkdir -p "$HOST$STATE_DIR"
	printf '%s\n' "$2" >"$HOST$1"
}

# ---------------------------------------------------------------------------------------------- kernel

pin_kernel() {
	detect_os
	node_tools
	if [ "$FAMILY" = rpm ]; then
		# Before the install: on Amazon Linux installing a kernel makes it the default on its own.
		_default=$(grubby_default)
		record "$BOOT_DEFAULT_BEFORE" "$_default"
	fi
	if kernel_installed; then
		say "kernel $KERNEL is installed"
	else
		install_kernel
	fi
	if [ "$FAMILY" = rpm ]; then default_with_grubby; else default_with_grub; fi
	remove_installed_kernels "$KERNEL" pin
}

install_kernel() {
	_packages=$(kernel_packages)
	say "installing kernel $KERNEL: $_packages"
	set -f
	if [ "$FAMILY" = deb ]; then
		DEBIAN_FRONTEND=noninteractive "$PM" update
		# shellcheck disable=SC2086 # one argument per package
		DEBIAN_FRONTEND=noninteractive "$PM" install -y $_packages
	else
		# shellcheck disable=SC2086 # one argument per package
		"$PM" install -y $_packages
	fi
	set +f
	kernel_installed || fail "the package manager installed $_packages, but /boot/vmlinuz-$KERNEL and" \
		"/lib/modules/$KERNEL are not both there: set kernel-packages to the packages that hold kernel $KERNEL"
	mkdir -p "$HOST$STATE_DIR"
	printf '%s %s\n' "$KERNEL" "$_packages" >>"$HOST$KERNEL_INSTALLED"
	CHANGED="$CHANGED kernel"
}

default_with_grubby() {
	_want=/boot/vmlinuz-$KERNEL
	_now=$(grubby_default)
	if [ "$_now" = "$_want" ]; then
		say "the boot loader's default is kernel $KERNEL"
		return 0
	fi
	"$GRUBBY" --set-default "$_want"
	_after=$(grubby_default)
	[ "$_after" = "$_want" ] || fail "grubby --set-default $_want did not take: grubby's default is $_after"
	say "the boot loader's default is now kernel $KERNEL (was $_now)"
	CHANGED="$CHANGED boot-default"
}

default_with_grub() {
	put "$GRUB_FILE" "$(render_grub)"
	case " $CHANGED " in *" $GRUB_FILE "*) update_grub ;; esac
	_effective=$(effective_grub_default)
	[ "$_effective" = "$(grub_entry)" ] || fail "GRUB_DEFAULT is '$_effective' after /etc/default/grub and" \
		"grub.d/*.cfg: a file read after $GRUB_FILE sets it; remove that setting"
}

update_grub() {
	"$UPDATE_GRUB"
}

# remove_installed_kernels KEEP WHY: remove the kernels this package installed but KEEP and the running
# one (package managers refuse to remove that one); WHY (pin | uninstall) says what becomes of it.
remove_installed_kernels() {
	[ -f "$HOST$KERNEL_INSTALLED" ] || return 0
	_running=$(running_kernel)
	_kept=
	while read -r _release _packages; do
		[ -n "$_release" ] && [ -f "$HOST/boot/vmlinuz-$_release" ] || continue
		if [ "$_release" = "$1" ] || [ "$_release" = "$_running" ]; then
			if [ "$_release" != "$1" ]; then
				if [ "$2" = pin ]; then
					_later="a later run of this package removes it once it no longer runs"
				else
					_later="after the uninstall's reboot, remove it with: ${PM##*/} remove -y $_packages"
				fi
				say "kernel $_release (installed by this package) is the running kernel, so it stays installed;" \
					"$_later"
			fi
			_kept="$_kept$_release $_packages
"
			continue
		fi
		say "removing kernel $_release (installed by this package, no longer pinned): $_packages"
		# stdin is the record being read: the package manager must not read it.
		set -f
		if [ "$FAMILY" = deb ]; then
			# shellcheck disable=SC2086 # one argument per package
			DEBIAN_FRONTEND=noninteractive "$PM" remove -y $_packages </dev/null
		else
			# shellcheck disable=SC2086 # one argument per package
			"$PM" remove -y $_packages </dev/null
		fi
		set +f
	done <"$HOST$KERNEL_INSTALLED"
	printf '%s' "$_kept" >"$HOST$KERNEL_INSTALLED"
}

unpin_kernel() {
	if [ ! -e "$HOST$BOOT_DEFAULT_BEFORE" ] && [ ! -e "$HOST$KERNEL_INSTALLED" ] && ! ours "$GRUB_FILE"; then
		say "no kernel pin of this package on the node: nothing to undo"
		return 0
	fi
	detect_os
	node_tools
	if [ "$FAMILY" = rpm ]; then
		if [ -f "$HOST$BOOT_DEFAULT_BEFORE" ]; then
			_before=$(cat "$HOST$BOOT_DEFAULT_BEFORE")
			_now=$(grubby_default)
			if [ "$_now" = "$_before" ]; then
				say "the boot loader's default is $_before, as before the package"
			elif [ -f "$HOST$_before" ]; then
				"$GRUBBY" --set-default "$_before"
				_now=$(grubby_default)
				[ "$_now" = "$_before" ] || fail "grubby --set-default $_before did not take: the default is $_now"
				say "the boot loader's default is $_before again"
			else
				warn "warning: $_before, the default before the package, is gone: the default stays $_now"
			fi
		fi
	else
		remove_ours "$GRUB_FILE"
		case " $CHANGED " in *" $GRUB_FILE "*) update_grub ;; esac
	fi
	remove_installed_kernels "" uninstall
}

# ------------------------------------------------------------------------------------------------- EFA

# fetch_installer VERSION: INSTALLER, the unpacked installer of VERSION under EFA_WORK (the only one kept).
fetch_installer() {
	_url=$(efa_url "$1")
	_work="$HOST$EFA_WORK/$1"
	rm -rf "$_work"
	mkdir -p "$_work"
	_tarball="$_work/aws-efa-installer-$1.tar.gz"
	case $_url in
	file://*)
		[ -f "$HOST${_url#file://}" ] || fail "efa-installer: ${_url#file://} is not a file on the node"
		cp "$HOST${_url#file://}" "$_tarball"
		;;
	*)
		_curl=$(need_tool curl "downloading the EFA installer")
		say "downloading $_url"
		"$_curl" -fsSL --retry 3 --max-time 600 -o "$_tarball" "$_url" || fail "downloading $_url failed"
		;;
	esac
	if [ -n "$EFA_SHA256" ] && [ "$1" = "$EFA" ]; then
		_sum=$(sha256sum "$_tarball")
		[ "${_sum%% *}" = "$EFA_SHA256" ] ||
			fail "the EFA installer from $_url has sha256 ${_sum%% *}, not the configured efa-sha256 $EFA_SHA256"
	fi
	tar -xzf "$_tarball" -C "$_work" || fail "$_url is not a gzip tar archive of the EFA installer"
	rm -f "$_tarball"
	INSTALLER="$_work/aws-efa-installer"
	[ -f "$INSTALLER/efa_installer.sh" ] || fail "$_url holds no aws-efa-installer/efa_installer.sh"
	for _other in "$HOST$EFA_WORK"/*; do
		if [ "$_other" != "$_work" ]; then rm -rf "$_other"; fi
	done
}

# run_installer ARGS...: INSTALLER's efa_installer.sh with ARGS, from its directory (as AWS documents).
run_installer() {
	if [ -n "$HOST" ] && [ -z "${NODEWRIGHT_HOST_TOOLS:-}" ]; then
		fail "the node's root is the directory $HOST: the EFA installer would change this machine instead;" \
			"set NODEWRIGHT_HOST_TOOLS to stand-ins that act on NODEWRIGHT_HOST_ROOT (the simulator does)"
	fi
	say "running efa_installer.sh $*"
	(cd "$INSTALLER" && ./efa_installer.sh "$@") || fail "efa_installer.sh $* failed (its output is above)"
}

# installer_of VERSION: INSTALLER for VERSION, the kept one if it is that version, else fetched.
installer_of() {
	if [ -f "$HOST$EFA_WORK/$1/aws-efa-installer/efa_installer.sh" ]; then
		INSTALLER="$HOST$EFA_WORK/$1/aws-efa-installer"
	else
		fetch_installer "$1"
	fi
}

install_efa() {
	_installed=$(installed_efa)
	record "$EFA_BEFORE" "$_installed"
	if [ "$_installed" = "$EFA" ]; then
		say "the EFA installer $EFA's packages are installed"
	else
		say "EFA: installed ${_installed}, configured $EFA"
		fetch_installer "$EFA"
		run_installer -y
		_installed=$(installed_efa)
		[ "$_installed" = "$EFA" ] || fail "efa_installer.sh $EFA ran, but $EFA_PACKAGES_FILE says $_installed"
		CHANGED="$CHANGED efa"
	fi
	put "$MODULES_FILE" "$(render_modules)"
	if efa_loaded; then
		say "the efa module is loaded"
	else
		_modprobe=$(need_tool modprobe "loading the efa module")
		"$_modprobe" efa
		efa_loaded || fail "modprobe efa ran, but efa is not in /proc/modules"
		say "loaded the efa module"
	fi
}

# restore_efa: the EFA the node had before the package (removed, or that version again).
restore_efa() {
	if [ -f "$HOST$EFA_BEFORE" ]; then
		_before=$(cat "$HOST$EFA_BEFORE")
		_installed=$(installed_efa)
		if [ "$_installed" = "$_before" ]; then
			say "EFA is as before the package ($_before)"
		elif [ "$_before" = unknown ] || [ "$_installed" = unknown ]; then
			warn "warning: EFA from an installer of unknown version cannot be swapped: EFA $_installed stays" \
				"(it was $_before before the package)"
		else
			if [ "$_installed" != none ]; then
				installer_of "$_installed"
				run_installer --uninstall -y
			fi
			if [ "$_before" != none ]; then
				fetch_installer "$_before"
				run_installer -y
			fi
			[ "$(installed_efa)" = "$_before" ] || fail "EFA is $(installed_efa) after restoring $_before"
			say "EFA is as before the package ($_before)"
		fi
		if [ "$_before" = none ] && efa_loaded; then
			_modprobe=$(need_tool modprobe "unloading the efa module")
			"$_modprobe" -r efa || warn "warning: the efa module stays loaded until the next reboot"
		fi
	fi
	remove_ours "$MODULES_FILE"
	rm -rf "$HOST$EFA_WORK" "$HOST$EFA_BEFORE"
}

# ------------------------------------------------------------------------------------------------ main

mode=${1:?usage: node_init.sh apply|config|upgrade|uninstall}
case $mode in
apply | config | upgrade)
	read_settings
	say "accelerator=$ACCELERATOR kernel=$KERNEL efa=$EFA (efa-devices $EFA_DEVICES)"
	pin_kernel
	if [ "$EFA" = none ]; then
		say "efa=none: EFA is not managed by this package"
		restore_efa
	else
		install_efa
	fi
	if [ -n "$CHANGED" ]; then
		say "changed:$CHANGED; the package's reboot interrupt boots kernel $KERNEL"
	fi
	;;
uninstall)
	read_efa_source
	restore_efa
	unpin_kernel
	rm -rf "$HOST$STATE_DIR"
	say "the reboot of the uninstall boots the kernel that was the default before the package"
	;;
*) fail "unknown mode '$mode' (apply, config, upgrade, uninstall)" ;;
esac
