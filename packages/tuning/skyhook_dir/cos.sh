# tuning on Container-Optimized OS (sourced by tuning.sh and tuning_check.sh after lib.sh). POSIX sh.
#
# COS, GKE's node image, boots a verified read-only root with a fixed kernel command line (there is no
# GRUB configuration to change), mounts /etc as a tmpfs that starts empty at every boot, keeps /var (the
# stateful partition) and has no package manager. So on COS the package:
# - writes the sysctl rows to the running kernel (/proc/sys) and the power rows to their sysfs files:
#   in effect at once, no interrupt needed (a reboot undoes them: README.md says how they come back);
# - leaves the table's grub rows out and names them, and refuses overrides that ask for a kernel parameter;
# - keeps, in /var/lib/nodewright-tuning/, what each setting held before it first changed it, and writes
#   that back when the setting leaves the intent and on uninstall.

COS_STATE=/var/lib/nodewright-tuning
COS_APPLIED=$COS_STATE/cos-applied
COS_ORIGINAL=$COS_STATE/cos-original
COS_REASON="Container-Optimized OS boots a fixed kernel command line from its verified image (no GRUB configuration)"
COS_REAPPLY="on Container-Optimized OS these values last until the next reboot: give the NodeWright driftDetection with action: reapply so that NodeWright applies them again after one (docs/drift.md)"

# cos_intent: ENTRIES without grub entries (named); fails when the configMap's overrides ask for one.
cos_intent() {
	_asked=
	if [ -f "$CONFIGMAPS/overrides" ]; then
		while read -r _kind _key _value; do
			if [ "$_kind" = grub ] && [ "$_value" != "!" ]; then _asked="${_asked:+$_asked, }$_key"; fi
		done <"$CONFIGMAPS/overrides"
	fi
	[ -z "$_asked" ] || fail "$COS_REASON: the overrides ask for kernel parameters it cannot set ($_asked);" \
		"remove them from overrides"
	_left_out=$(kernel_parameters)
	if [ -n "$_left_out" ]; then
		say "not on Container-Optimized OS: kernel parameters $_left_out (the table's rows for $INTENT;" \
			"$COS_REASON)"
		for _word in $_left_out; do set_entry grub "${_word%%=*}" "!"; done
	fi
}

# cos_targets: TARGETS, the lines "sysctl KEY VALUE" and "power FILE VALUE" (each sysfs file of a power
# setting that exists on this node) the intent gives; fails naming every sysctl this kernel lacks.
cos_targets() {
	TARGETS=
	_missing=
	while read -r _kind _key _value; do
		case $_kind in
		sysctl)
			if [ -f "$HOST/proc/sys/$(key_path "$_key")" ]; then
				TARGETS="$TARGETS
sysctl $_key $_value"
			else
				_missing="${_missing:+$_missing, }$_key"
			fi
			;;
		power)
			_seen=0
			for _file in "$HOST"$(power_path "$_key"); do
				[ -f "$_file" ] || continue
				_seen=1
				TARGETS="$TARGETS
power ${_file#"$HOST"} $_value"
			done
			[ "$_seen" -eq 1 ] || say "power $_key: this node exposes no $(power_path "$_key"); nothing to set"
			;;
		esac
	done <<LIST
$ENTRIES
LIST
	[ -z "$_missing" ] || fail "this kernel has no sysctl $_missing (no file under /proc/sys): nothing was changed"
}

# target_path KIND NAME: the file that holds the setting on this node.
target_path() {
	case $1 in
	sysctl) printf '%s' "$HOST/proc/sys/$(key_path "$2")" ;;
	*) printf '%s' "$HOST$2" ;;
	esac
}

# running KIND NAME: the value the node has now, blanks as single spaces (procfs separates with tabs).
running() {
	words "$(sysfs_value "$(target_path "$1" "$2")")"
}

# lookup FILE KIND NAME: the value FILE (lines "KIND NAME VALUE") records for KIND NAME; status 1 if none.
lookup() {
	[ -f "$HOST$1" ] || return 1
	while read -r _k _n _v; do
		if [ "$_k" = "$2" ] && [ "$_n" = "$3" ]; then
			printf '%s' "$_v"
			return 0
		fi
	done <"$HOST$1"
	return 1
}

# put_value KIND NAME VALUE: write VALUE to the node and read it back (the kernel may refuse a value).
put_value() {
	printf '%s\n' "$3" >"$(target_path "$1" "$2")"
	_now=$(running "$1" "$2")
	[ "$_now" = "$(words "$3")" ] || fail "$1 $2: wrote '$3' but the node reads back '$_now'"
}

# cos_apply: make the running node hold TARGETS, recording first values; settings the previous run set
# that the intent no longer has get their first values back.
cos_apply() {
	mkdir -p "$HOST$COS_STATE"
	while read -r _kind _name _value; do
		[ -n "$_kind" ] || continue
		_was=$(running "$_kind" "$_name")
		if ! lookup "$COS_ORIGINAL" "$_kind" "$_name" >/dev/null; then
			printf '%s %s %s\n' "$_kind" "$_name" "$_was" >>"$HOST$COS_ORIGINAL"
		fi
		if [ "$_was" = "$(words "$_value")" ]; then
			say "unchanged: $_kind $_name = $_value"
		else
			put_value "$_kind" "$_name" "$_value"
			say "set $_kind $_name = $_value (was '$_was')"
		fi
	done <<LIST
$TARGETS
LIST
	if [ -f "$HOST$COS_APPLIED" ]; then
		while read -r _kind _name _value; do
			case $_kind in '' | '#'*) continue ;; esac
			case "$TARGETS
" in *"
$_kind $_name "*) continue ;; esac
			cos_restore "$_kind" "$_name"
		done <"$HOST$COS_APPLIED"
	fi
	cos_record >"$HOST$COS_APPLIED.nodewright-tmp"
	mv -f "$HOST$COS_APPLIED.nodewright-tmp" "$HOST$COS_APPLIED"
}

# cos_record: what COS_APPLIED holds after a run: a header, then TARGETS.
cos_record() {
	printf '# Applied at runtime by the NodeWright tuning package for %s (Container-Optimized OS).\n' "$INTENT"
	while read -r _line; do
		if [ -n "$_line" ]; then printf '%s\n' "$_line"; fi
	done <<LIST
$TARGETS
LIST
}

# cos_restore KIND NAME: write back what the setting held before the package first changed it; forget it.
cos_restore() {
	if _first=$(lookup "$COS_ORIGINAL" "$1" "$2") && [ -f "$(target_path "$1" "$2")" ]; then
		put_value "$1" "$2" "$_first"
		say "restored $1 $2 = $_first (no longer in the intent)"
	else
		warn "warning: $1 $2: no value from before the package changed it, or no such setting now; left as it is"
	fi
	_kept=$(
		while read -r _k _n _v; do
			if [ "$_k $_n" != "$1 $2" ]; then printf '%s %s %s\n' "$_k" "$_n" "$_v"; fi
		done <"$HOST$COS_ORIGINAL"
	)
	printf '%s\n' "$_kept" >"$HOST$COS_ORIGINAL"
}

# cos_uninstall: every setting the package changed gets its first value back; the records go.
cos_uninstall() {
	if [ -f "$HOST$COS_ORIGINAL" ]; then
		while read -r _kind _name _value; do
			[ -n "$_kind" ] || continue
			if [ -f "$(target_path "$_kind" "$_name")" ]; then
				put_value "$_kind" "$_name" "$_value"
				say "restored $_kind $_name = $_value"
			fi
		done <"$HOST$COS_ORIGINAL"
	else
		say "nothing recorded in $COS_ORIGINAL: nothing to restore"
	fi
	rm -rf "$HOST$COS_STATE"
}
