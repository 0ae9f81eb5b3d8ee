# shell: shared by run.sh and run_check.sh (sourced). POSIX sh; runs under dash, bash and busybox.
#
# Each mode runs the script of the same name from the package's configMap, e.g. apply.sh in apply,
# apply_check.sh in apply-check, post_interrupt.sh in post-interrupt. A script starting with #! runs
# with that interpreter (the node's: on a node the step is chrooted into the host's /), any other with
# /bin/sh. Its exit code is the step's. A script that is not given means the mode has nothing to do --
# except a check whose work script is given: every script that changes the node needs its check.

CONFIGMAPS="${SKYHOOK_DIR:?SKYHOOK_DIR is not set: run this step through the NodeWright agent}/configmaps"

say() { printf 'shell: %s\n' "$*"; }
warn() { printf 'shell: %s\n' "$*" >&2; }

# work_of CHECK: the work script a check script verifies (apply_check.sh -> apply.sh).
work_of() {
	printf '%s' "${1%_check.sh}.sh"
}

# run_script NAME ROLE: exec the configMap's script NAME; ROLE is work or check.
run_script() {
	_script="$CONFIGMAPS/$1"
	if [ ! -f "$_script" ]; then
		if [ "$2" = check ] && [ -f "$CONFIGMAPS/$(work_of "$1")" ]; then
			warn "the configMap gives $(work_of "$1") but not $1: add the check that proves its work"
			exit 1
		fi
		say "no $1 in the package's configMap: nothing to do"
		exit 0
	fi
	_first=
	IFS= read -r _first <"$_script" || true
	say "running $1 from the package's configMap"
	case $_first in
	'#!'*)
		chmod +x "$_script"
		exec "$_script"
		;;
	*) exec /bin/sh "$_script" ;;
	esac
}
