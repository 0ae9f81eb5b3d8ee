# tuning: shared by tuning.sh and tuning_check.sh (sourced). POSIX sh; runs under dash, bash and busybox.
#
# Intent (the package's configMap): `accelerator` (hopper | blackwell | generic), `workload` (training |
# inference), optionally `cloud` (on-prem | aws | gcp | azure | oci; on-prem when unset) and `overrides`
# (lines "KIND KEY VALUE", applied after the table; VALUE ! removes the key). The table (tuning.table
# next to this file) turns the intent into three files on the node; on Container-Optimized OS (no GRUB,
# /etc reset at every boot) into runtime values instead (cos.sh).

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
CLOUDS="on-prem aws gcp azure oci"
POWER_SETTINGS="cpu_governor cpu_boost cpu_min_perf_pct"

say() { printf 'tuning: %s\n' "$*"; }
warn() { printf 'tuning: %s\n' "$*" >&2; }
fail() {
	warn "$*"
	exit 1
}

# one_word KEY CHOICES [DEFAULT]: the configMap value of KEY, which must be one of CHOICES; DEFAULT when
# the configMap has no KEY (without a DEFAULT the key is required).
one_word() {
	_key=$1
	_choices=$2
	if [ ! -f "$CONFIGMAPS/$_key" ]; then
		[ $# -lt 3 ] || {
			printf '%s' "$3"
			return 0
		}
		fail "the package's configMap has no '$_key' key; set it to one of: $_choices"
	fi
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

# read_intent: ACCELERATOR, WORKLOAD, CLOUD and INTENT (the three as text for messages and headers: the
# cloud only when it is not on-prem, so files written before `cloud` existed keep their content).
read_intent() {
	ACCELERATOR=$(one_word accelerator "$ACCELERATORS")
	WORKLOAD=$(one_word workload "$WORKLOADS")
	_default_cloud=on-prem
	if on_cos; then _default_cloud=gcp; fi
	CLOUD=$(one_word cloud "$CLOUDS" "$_default_cloud")
	if on_cos && [ "$CLOUD" != gcp ]; then
		fail "this node runs Container-Optimized OS, Google's node image, but the configMap says cloud=$CLOUD;" \
			"set cloud to gcp or leave it out"
	fi
	INTENT="accelerator=$ACCELERATOR workload=$WORKLOAD"
	if [ "$CLOUD" != on-prem ]; then INTENT="$INTENT cloud=$CLOUD"; fi
}

# on_cos: the node runs Container-Optimized OS (GKE's node image): /etc/os-release says ID=cos.
on_cos() {
	[ -f "$HOST/etc/os-release" ] || return 1
	while IFS= read -r _line || [ -n "$_line" ]; do
		case $_line in ID=cos | ID=\"cos\" | ID=\'cos\') return 0 ;; esac
	done <"$HOST/etc/os-release"
	return 1
}

# power_path SETTING: the sysfs file(s) a power setting writes, as a glob.
power_path() {
	case $1 in
	cpu_governor) printf '%s' '/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor' ;;
	cpu_boost) printf '%s' '/sys/devices/system/cpu/cpufreq/boost' ;;
	cpu_min_perf_pct) printf '%s' '/sys/devices/system/cpu/intel_pstate/min_perf_pct' ;;
	esac
}

# sysfs_value FILE: the value a sysfs file holds; files that list every choice with the active one in
# brackets (`[performance] powersave`) give the bracketed one.
sysfs_value() {
	_sysfs=$(cat "$1")
	case $_sysfs in *'['*']'*)
		_sysfs=${_sysfs#*[}
		_sysfs=${_sysfs%%]*}
		;;
	esac
	printf '%s' "$_sysfs"
}

# show: what the intent gives, one line per setting (what `nodewright package run` prints for an intent).
show() {
	while read -r _kind _key _value; do
		case $_kind in
		sysctl) say "  sysctl $_key = $_value" ;;
		grub) if [ "$_value" = "-" ]; then say "  kernel parameter $_key"; else say "  kernel parameter $_key=$_value"; fi ;;
		power) say "  power $_key = $_value ($(power_path "$_key"))" ;;
		esac
	done <<LIST
$ENTRIES
LIST
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

# assemble: ENTRIES for CLOUD, ACCELERATOR and WORKLOAD from the table, then the configMap's overrides.
assemble() {
	ENTRIES=
	_line_number=0
	while read -r _cloud _accelerator _workload _kind _key _value; do
		_line_number=$((_line_number + 1))
		case $_cloud in '' | '#'*) continue ;; esac
		[ "$_cloud" = '*' ] || [ "$_cloud" = "$CLOUD" ] || continue
		[ "$_accelerator" = '*' ] || [ "$_accelerator" = "$ACCELERATOR" ] || continue
		[ "$_workload" = '*' ] || [ "$_workload" = "$WORKLOAD" ] || continue
		[ "$_value" = "!" ] || check_entry "$_kind" "$_key" "$_value" "tuning.table line $_line_number"
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
	printf '# Written by the NodeWright tuning package for %s; removed on uninstall.\n' "$INTENT"
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
