#!/bin/sh
# tuning: write the configured intent's settings (apply, config, upgrade) or remove them (uninstall).
# Idempotent: a file is replaced only when its content changes, and the boot loader configuration is
# regenerated only when the kernel command line changed. Nothing here changes the running kernel; the
# package's interrupt (a reboot) applies the files, and post-interrupt-check reads the values back.
# On Container-Optimized OS (cos.sh) the settings are written to the running kernel instead.
set -eu
. "${0%/*}/lib.sh"
. "${0%/*}/cos.sh"

# install FILE: make FILE (a host path) hold `expected FILE`, or remove it when nothing is expected.
# Sets CHANGED when it did anything.
install() {
	_target="$HOST$1"
	_content=$(expected "$1")
	if [ -z "$_content" ]; then
		if [ -e "$_target" ]; then
			rm -f "$_target"
			say "removed $1 (nothing of this kind for $INTENT)"
			CHANGED="$CHANGED $1"
		fi
		return 0
	fi
	if [ -f "$_target" ] && [ "$(cat "$_target")" = "$_content" ]; then
		say "unchanged: $1"
		return 0
	fi
	mkdir -p "${_target%/*}"
	printf '%s\n' "$_content" >"$_target.nodewright-tmp"
	mv -f "$_target.nodewright-tmp" "$_target"
	say "wrote $1"
	CHANGED="$CHANGED $1"
}

remove() {
	if [ -e "$HOST$1" ]; then
		rm -f "$HOST$1"
		say "removed $1"
		CHANGED="$CHANGED $1"
	fi
}

# announce: the intent and everything it gives, before anything is written.
announce() {
	say "intent: $INTENT: $(count sysctl) sysctl settings, $(count grub) kernel parameters," \
		"$(count power) power settings"
	show
}

mode=${1:?usage: tuning.sh apply|config|upgrade|uninstall}
CHANGED=
case $mode in
apply | config | upgrade)
	read_intent
	assemble
	if on_cos; then
		cos_intent
		announce
		cos_targets
		cos_apply
		say "applied to the running node (Container-Optimized OS: nothing to reboot for)"
		exit 0
	fi
	announce
	install "$SYSCTL_FILE"
	install "$GRUB_FILE"
	install "$POWER_FILE"
	;;
uninstall)
	if on_cos; then
		cos_uninstall
		exit 0
	fi
	remove "$SYSCTL_FILE"
	remove "$GRUB_FILE"
	remove "$POWER_FILE"
	say "the running kernel keeps the current values until the next reboot"
	;;
*) fail "unknown mode '$mode' (apply, config, upgrade, uninstall)" ;;
esac
case " $CHANGED " in
*" $GRUB_FILE "*) regenerate_grub ;;
esac
if [ -n "$CHANGED" ]; then
	say "changed:$CHANGED; the package's reboot interrupt applies them"
fi
