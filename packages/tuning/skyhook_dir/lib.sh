# tuning: shared by tuning.sh and tuning_check.sh (sourced). POSIX sh; runs under dash, bash and busybox.
#
# Intent (the package's configMap): `accelerator` (hopper | blackwell | generic), `workload` (training |
# inference), optionally `overrides` (lines "KIND KEY VALUE", applied after the table; VALUE ! removes
# the key). The table (tuning.table next to this file) turns the intent into three files on the node.

# The node's root as the step sees it: "" for / (on a node the agent chroots into the host's /), else
# the directory standing for the node (nodewright package run, the simulator).
HOST="${NODEWRIGHT_HOST_ROOT:-/}"
HOST="${HOST%/}"
CONFIGMAPS="${SKYHOOK_DIR:?SKYHOOK_DIR is not set: run this step through the NodeWright agent}/configmaps"
TABLE="${0%/*}/tuning.table"
SYSCTL_FILE=/etc/sysctl.d/90-nodewright-tuning.conf
GRUB_FILE=/etc/default/grub.d/90-nodewright-tuning.cfg
POWER_FILE=/etc/tmpfiles.d/90-nodewright-tuning.conf
ACCELERATORS="hopper blackwell generic"
WORKLOADS="training inference"
POWER_SETTINGS="cpu_governor cpu_boost cpu_min_perf_pct"

say() { printf 'tuning: %s\n' "$*"; }
warn() { printf 'tuning: %s\n' "$*" >&2; }
fail() {
	warn "$*"
	exit 1
}

# one_word KEY CHOICES: the configMap value of KEY, which must be one of CHOICES.
one_word() {
	_key=$1
	_choices=$2
	[ -f "$CONFIGMAPS/$_key" ] || fail "the package's configMap has no '$_key' key; set it to one of: $_choices"
	set -f
	# shellcheck disable=SC2046 # word splitting is the point: surrounding blanks and newlines go
	set -- $(cat "$CONFIGMAPS/$_key")
	set +f
	for _choice in $_choices; do
		if [ $# -eq 1 ] && [ "$1" = "$_choice" ]; then
			printf '%s' "$1"
			return 0
		fi
	done
	fail "configMap key '$_key' is '$*'; use one of: $_choices"
}

read_intent() {
	ACCELERATOR=$(one_word accelerator "$ACCELERATORS")
	WORKLOAD=$(one_word workload "$WORKLOADS")
}

# power_path SETTING: the sysfs file(s) a power setting writes, as a glob.
power_path() {
	case $1 in
	cpu_governor) printf '%s' '/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor' ;;
	cpu_boost) printf '%s' '/sys/devices/system/cpu/cpufreq/boost' ;;
	cpu_min_perf_pct) printf '%s' '/sys/devices/system/cpu/intel_pstate/min_perf_pct' ;;
	esac
}

# check_entry KIND KEY VALUE WHERE: refuse what could not be written safely (the grub file is sourced by
# a shell, sysctl keys become paths).
check_entry() {
	case $1 in
	sysctl)
		case $2 in '' | .* | *..* | *. | *[!a-z0-9_.]*)
			fail "$4: sysctl key '$2' must be lowercase letters, digits, '_' and '.' (e.g. vm.swappiness)"
			;;
		esac
		;;
	grub)
		case $2 in '' | *[!A-Za-z0-9_.-]*)
			fail "$4: kernel parameter '$2' may only use letters, digits, '_', '.' and '-'"
			;;
		esac
		case $3 in *' '*) fail "$4: kernel parameter $2 has a value with spaces ('$3')" ;; esac
		;;
	power)
		case " $POWER_SETTINGS " in *" $2 "*) ;; *)
			fail "$4: unknown power setting '$2'; known: $POWER_SETTINGS"
			;;
		esac
		;;
	*) fail "$4: kind '$1' is not sysctl, grub or power" ;;
	esac
	case $3 in
	'') fail "$4: $1 $2 has no value" ;;
	*[!A-Za-z0-9' '._:,/+=-]*)
		fail "$4: the value '$3' of $1 $2 may only use letters, digits, spaces and . _ : , / + = -"
		;;
	esac
}

# set_entry KIND KEY VALUE: ENTRIES ("KIND KEY VALUE" lines) without KIND KEY, then with it unless VALUE is !.
set_entry() {
	ENTRIES=$(
		while IFS= read -r _line; do
			case $_line in "" | "$1 $2 "*) ;; *) printf '%s\n' "$_line" ;; esac
		done <<EOF
$ENTRIES
EOF
	)
	if [ "$3" != "!" ]; then
		ENTRIES="$ENTRIES
$1 $2 $3"
	fi
}

# assemble: ENTRIES for ACCELERATOR and WORKLOAD from the table, then the configMap's overrides.
assemble() {
	ENTRIES=
	_line_number=0
	while read -r _accelerator _workload _kind _key _value; do
		_line_number=$((_line_number + 1))
		case $_accelerator in '' | '#'*) continue ;; esac
		[ "$_accelerator" = '*' ] || [ "$_accelerator" = "$ACCELERATOR" ] || continue
		[ "$_workload" = '*' ] || [ "$_workload" = "$WORKLOAD" ] || continue
		check_entry "$_kind" "$_key" "$_value" "tuning.table line $_line_number"
		set_entry "$_kind" "$_key" "$_value"
	done <"$TABLE"
	[ -f "$CONFIGMAPS/overrides" ] || return 0
	_line_number=0
	while read -r _kind _key _value; do
		_line_number=$((_line_number + 1))
		case $_kind in '' | '#'*) continue ;; esac
		[ "$_value" = "!" ] || check_entry "$_kind" "$_key" "$_value" "configMap overrides line $_line_number"
		set_entry "$_kind" "$_key" "$_value"
	done <"$CONFIGMAPS/overrides"
}

# count KIND: how many entries of KIND.
count() {
	_count=0
	while read -r _kind _rest; do
		if [ "$_kind" = "$1" ]; then _count=$((_count + 1)); fi
	done <<EOF
$ENTRIES
EOF
	printf '%s' "$_count"
}

header() {
	printf '# Written by the NodeWright tuning package for accelerator=%s workload=%s; removed on uninstall.\n' \
		"$ACCELERATOR" "$WORKLOAD"
	printf "# Do not edit: the package's checks fail on any change. Change the package's configMap instead.\n"
}

render_sysctl() {
	header
	while read -r _kind _key _value; do
		if [ "$_kind" = sysctl ]; then printf '%s = %s\n' "$_key" "$_value"; fi
	done <<EOF
$ENTRIES
EOF
}

# kernel_parameters: the grub entries as they appear on the kernel command line.
kernel_parameters() {
	_parameters=
	while read -r _kind _key _value; do
		[ "$_kind" = grub ] || continue
		if [ "$_value" = "-" ]; then _word=$_key; else _word="$_key=$_value"; fi
		_parameters="${_parameters:+$_parameters }$_word"
	done <<EOF
$ENTRIES
EOF
	printf '%s' "$_parameters"
}

render_grub() {
	header
	printf '# Sourced by update-grub: appends these parameters to every kernel command line.\n'
	printf 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX %s"\n' "$(kernel_parameters)"
}

render_power() {
	header
	printf '# systemd-tmpfiles writes each value at boot, to the files that exist on this machine.\n'
	while read -r _kind _key _value; do
		if [ "$_kind" = power ]; then printf 'w %s - - - - %s\n' "$(power_path "$_key")" "$_value"; fi
	done <<EOF
$ENTRIES
EOF
}

# expected FILE: what FILE must contain now; empty when it must not exist.
expected() {
	case $1 in
	"$SYSCTL_FILE") _kind=sysctl ;;
	"$GRUB_FILE") _kind=grub ;;
	*) _kind=power ;;
	esac
	[ "$(count "$_kind")" -gt 0 ] || return 0
	case $_kind in
	sysctl) render_sysctl ;;
	grub) render_grub ;;
	power) render_power ;;
	esac
}

# key_path KEY: a sysctl key as a path below /proc/sys (net.core.rmem_max -> net/core/rmem_max).
key_path() {
	_rest=$1
	_path=
	while :; do
		case $_rest in
		*.*)
			_path="$_path${_rest%%.*}/"
			_rest=${_rest#*.}
			;;
		*)
			printf '%s' "$_path$_rest"
			return 0
			;;
		esac
	done
}

# words TEXT: TEXT with every run of blanks (tabs from /proc, spaces from files) as one space.
words() {
	set -f
	# shellcheck disable=SC2086 # splitting is the point
	set -- $1
	set +f
	printf '%s' "$*"
}

# regenerate_grub: make the boot loader read /etc/default/grub.d again (only on the node itself).
regenerate_grub() {
	if [ -n "$HOST" ]; then
		say "the node's root is $HOST, not /: boot loader configuration not regenerated here"
		return 0
	fi
	if command -v update-grub >/dev/null 2>&1; then
		update-grub
	elif command -v grub-mkconfig >/dev/null 2>&1 && [ -f /boot/grub/grub.cfg ]; then
		grub-mkconfig -o /boot/grub/grub.cfg
	else
		warn "warning: no update-grub or grub-mkconfig on this node: $GRUB_FILE takes effect only where the" \
			"boot loader reads /etc/default/grub.d (Debian, Ubuntu); the post-interrupt check reads the" \
			"running kernel's command line back"
	fi
}
