# eks-node-init: shared by node_init.sh and node_init_check.sh (sourced). POSIX sh; runs under dash, bash
# and busybox.
#
# Brings an EKS GPU node (Hopper or Blackwell) to a pinned kernel and an installed EFA driver:
# - kernel: the release named by the configMap's `kernel` (what `uname -r` prints) is installed with
#   the node's package manager and made the boot loader's default: dnf or yum and grubby on Amazon
#   Linux (AL2023, AL2), apt-get and GRUB (/etc/default/grub.d, update-grub) on Ubuntu; the package's
#   reboot interrupt boots it and post-interrupt-check reads the running kernel back;
# - EFA: AWS's EFA installer (aws-efa-installer-<version>.tar.gz, fetched from efa-installer.amazonaws.com
#   or a mirror) installs the driver and libfabric; the `efa` module is loaded and listed in
#   /etc/modules-load.d; the checks read the installed version, the loaded module, the EFA devices and
#   the libfabric provider back.
# What the node had before (the boot default, the EFA version) is recorded in STATE_DIR and put back on
# uninstall.

# The node's root as the step sees it: "" for / (on a node the agent chroots into the host's /), else
# the directory standing for the node (nodewright package run, the simulator).
HOST="${NODEWRIGHT_HOST_ROOT:-/}"
HOST="${HOST%/}"
CONFIGMAPS="${SKYHOOK_DIR:?SKYHOOK_DIR is not set: run this step through the NodeWright agent}/configmaps"
DEFAULTS="${0%/*}/defaults.table"
STATE_DIR=/var/lib/nodewright-eks-node-init
BOOT_DEFAULT_BEFORE=$STATE_DIR/boot-default-before
KERNEL_INSTALLED=$STATE_DIR/kernel-installed
EFA_BEFORE=$STATE_DIR/efa-before
EFA_WORK=$STATE_DIR/efa
GRUB_FILE=/etc/default/grub.d/zz-nodewright-eks-node-init.cfg
MODULES_FILE=/etc/modules-load.d/90-nodewright-efa.conf
EFA_PACKAGES_FILE=/opt/amazon/efa_installed_packages
FI_INFO=/opt/amazon/efa/bin/fi_info
MARKER="# Written by the NodeWright eks-node-init package"
ACCELERATORS="hopper blackwell"
DEFAULT_EFA_URL="https://efa-installer.amazonaws.com/aws-efa-installer-{version}.tar.gz"

say() { printf 'eks-node-init: %s\n' "$*"; }
warn() { printf 'eks-node-init: %s\n' "$*" >&2; }
fail() {
	warn "$*"
	exit 1
}

# given KEY: the configMap has KEY.
given() { [ -f "$CONFIGMAPS/$1" ]; }

# words_of KEY: the configMap value of KEY with every run of blanks and newlines as one space.
words_of() {
	set -f
	# shellcheck disable=SC2046 # splitting is the point
	set -- $(cat "$CONFIGMAPS/$1")
	set +f
	printf '%s' "$*"
}

# one_word KEY DEFAULT: the configMap value of KEY as one word, or DEFAULT without the key.
one_word() {
	if ! given "$1"; then
		printf '%s' "$2"
		return 0
	fi
	_one=$(words_of "$1")
	case $_one in
	'' | *' '*) fail "configMap key '$1' must be one word, not '$_one'" ;;
	esac
	printf '%s' "$_one"
}

# default KEY: the defaults.table value of KEY for ACCELERATOR.
default() {
	_found=
	while read -r _accelerator _key _value; do
		case $_accelerator in '' | '#'*) continue ;; esac
		if [ "$_key" = "$1" ] && { [ "$_accelerator" = '*' ] || [ "$_accelerator" = "$ACCELERATOR" ]; }; then
			_found=$_value
		fi
	done <"$DEFAULTS"
	printf '%s' "$_found"
}

# Set by read_settings (uninstall reads only read_efa_source).
KERNEL=
EFA=none
EFA_SHA256=

# read_settings: ACCELERATOR KERNEL KERNEL_PACKAGES (may be empty: the package manager's default) EFA
# (a version or none) EFA_URL EFA_SHA256 EFA_DEVICES, each checked before anything changes.
read_settings() {
	given accelerator || fail "the package's configMap has no 'accelerator' key; set it to one of: $ACCELERATORS"
	ACCELERATOR=$(one_word accelerator "")
	case " $ACCELERATORS " in *" $ACCELERATOR "*) ;; *)
		fail "configMap key 'accelerator' is '$ACCELERATOR'; use one of: $ACCELERATORS"
		;;
	esac
	given kernel || fail "the package's configMap has no 'kernel' key; set it to the kernel release to pin," \
		"as uname -r prints it (e.g. 6.1.132-147.221.amzn2023.x86_64 or 6.8.0-1024-aws)"
	KERNEL=$(one_word kernel "")
	case $KERNEL in
	[0-9]*) ;;
	*) fail "kernel '$KERNEL' must be a kernel release as uname -r prints it, starting with a digit" ;;
	esac
	case $KERNEL in *[!A-Za-z0-9._+-]*) fail "kernel '$KERNEL' may only use letters, digits and . _ + -" ;; esac
	KERNEL_PACKAGES=
	if given kernel-packages; then
		KERNEL_PACKAGES=$(words_of kernel-packages)
		case $KERNEL_PACKAGES in
		'') fail "configMap key 'kernel-packages' is empty; leave it out for the package manager's default" ;;
		*[!A-Za-z0-9._+:' '-]*)
			fail "kernel-packages '$KERNEL_PACKAGES' may only hold package names (letters, digits, . _ + : -)"
			;;
		-* | *' -'*) fail "kernel-packages '$KERNEL_PACKAGES' holds an option, not a package name" ;;
		esac
	fi
	EFA=$(one_word efa "$(default efa)")
	case $EFA in
	none) ;;
	[0-9]*.[0-9]*) case $EFA in *[!0-9.]*) fail "efa '$EFA' must be an installer version such as 1.47.0, or none" ;; esac ;;
	*) fail "efa '$EFA' must be an installer version such as 1.47.0, or none" ;;
	esac
	read_efa_source
	EFA_SHA256=$(one_word efa-sha256 "")
	case $EFA_SHA256 in
	'') ;;
	*[!0-9a-f]*) fail "efa-sha256 must be 64 lowercase hex digits" ;;
	*) [ ${#EFA_SHA256} -eq 64 ] || fail "efa-sha256 must be 64 lowercase hex digits" ;;
	esac
	EFA_DEVICES=$(one_word efa-devices "$(default efa-devices)")
	case $EFA_DEVICES in '' | *[!0-9]*) fail "efa-devices '$EFA_DEVICES' must be a whole number" ;; esac
}

# read_efa_source: EFA_URL, where installers come from (efa-installer, else AWS's).
read_efa_source() {
	EFA_URL=$(one_word efa-installer "$DEFAULT_EFA_URL")
	case $EFA_URL in
	https://* | http://* | file:///*) ;;
	*) fail "efa-installer '$EFA_URL' must be an https://, http:// or file:/// URL" ;;
	esac
	case $EFA_URL in *[!A-Za-z0-9._~:/?#@%=+,{}\&-]*)
		fail "efa-installer '$EFA_URL' may only use letters, digits and . _ ~ : / ? # @ % = + , { } & -"
		;;
	esac
}

# ----------------------------------------------------------------------------------------------------
# The node's tools

# tool NAME: the node's command NAME as a path; status 1 when there is none. On the node that is its
# own command (PATH). Against a directory standing for a node it is only a stand-in that acts on that
# directory: one in NODEWRIGHT_HOST_TOOLS (the simulator sets it; tests give theirs), never this
# machine's dnf or apt-get.
tool() {
	if [ -z "$HOST" ]; then
		# The file on PATH, not `command -v`: a busybox shell would answer with its own applet's name.
		_dirs=$PATH
		while [ -n "$_dirs" ]; do
			_dir=${_dirs%%:*}
			if [ -n "$_dir" ] && [ -f "$_dir/$1" ] && [ -x "$_dir/$1" ]; then
				printf '%s\n' "$_dir/$1"
				return 0
			fi
			case $_dirs in *:*) _dirs=${_dirs#*:} ;; *) _dirs= ;; esac
		done
		return 1
	fi
	[ -n "${NODEWRIGHT_HOST_TOOLS:-}" ] && [ -x "$NODEWRIGHT_HOST_TOOLS/$1" ] || return 1
	printf '%s\n' "$NODEWRIGHT_HOST_TOOLS/$1"
}

# need_tool NAME WHAT: tool NAME, or fail saying what it is needed for.
need_tool() {
	if _path=$(tool "$1"); then
		printf '%s' "$_path"
		return 0
	fi
	if [ -n "$HOST" ]; then
		fail "$2 needs the node's $1, and the node's root is the directory $HOST: this machine's $1 must not" \
			"act on it; set NODEWRIGHT_HOST_TOOLS to a directory of stand-ins that act on NODEWRIGHT_HOST_ROOT" \
			"(the simulator does)"
	fi
	fail "$2 needs $1, and this node has none"
}

# os_field NAME: NAME= of the node's /etc/os-release, quotes dropped.
os_field() {
	[ -f "$HOST/etc/os-release" ] || return 0
	while IFS= read -r _line || [ -n "$_line" ]; do
		case $_line in "$1="*)
			_field=${_line#*=}
			_field=${_field#[\"\']}
			printf '%s' "${_field%[\"\']}"
			return 0
			;;
		esac
	done <"$HOST/etc/os-release"
}

# detect_os: FAMILY (rpm | deb) and DISTRIBUTOR (GRUB's menu name on deb) from /etc/os-release; fails on
# anything else.
detect_os() {
	_id=$(os_field ID)
	_like=" $(os_field ID_LIKE) "
	case "$_id:$_like" in
	amzn:* | rhel:* | centos:* | rocky:* | almalinux:* | fedora:* | *' rhel '* | *' fedora '* | *' centos '*)
		FAMILY=rpm
		;;
	ubuntu:*)
		FAMILY=deb
		DISTRIBUTOR=Ubuntu
		;;
	debian:*)
		FAMILY=deb
		DISTRIBUTOR="Debian GNU/Linux"
		;;
	*)
		fail "this node's /etc/os-release says ID=${_id:-nothing}: eks-node-init knows Amazon Linux (dnf or yum," \
			"and grubby) and Ubuntu (apt-get and GRUB), the EKS node images"
		;;
	esac
}

# node_tools: PM, the node's package manager (dnf, else yum, on rpm; apt-get on deb), and the boot
# loader's tool: GRUBBY on rpm, UPDATE_GRUB on deb.
node_tools() {
	if [ "$FAMILY" = rpm ]; then
		PM=$(tool dnf) || PM=$(need_tool yum "installing a kernel (dnf or yum)")
		GRUBBY=$(need_tool grubby "setting the boot loader's default kernel")
	else
		PM=$(need_tool apt-get "installing a kernel")
		UPDATE_GRUB=$(need_tool update-grub "setting GRUB's default kernel")
	fi
}

# kernel_packages: the packages that hold KERNEL (kernel-packages, else the family's usual names).
kernel_packages() {
	if [ -n "$KERNEL_PACKAGES" ]; then
		printf '%s' "$KERNEL_PACKAGES"
	elif [ "$FAMILY" = rpm ]; then
		printf 'kernel-%s' "$KERNEL"
	else
		printf 'linux-image-%s linux-modules-%s linux-modules-extra-%s linux-headers-%s' \
			"$KERNEL" "$KERNEL" "$KERNEL" "$KERNEL"
	fi
}

# kernel_installed: KERNEL's image and modules are on the node.
kernel_installed() {
	[ -f "$HOST/boot/vmlinuz-$KERNEL" ] && [ -d "$HOST/lib/modules/$KERNEL" ]
}

# running_kernel: the release of the running kernel, what `uname -r` prints (/proc/sys/kernel/osrelease
# under the node's root: the running kernel's on a node, the simulated boot's on a simulated one).
running_kernel() {
	if [ -f "$HOST/proc/sys/kernel/osrelease" ]; then cat "$HOST/proc/sys/kernel/osrelease"; fi
}

# grub_entry: the GRUB menu path of KERNEL as Debian's and Ubuntu's update-grub name it (in the
# "Advanced options" submenu unless GRUB_DISABLE_SUBMENU puts every kernel at the top).
grub_entry() {
	case $(grub_setting GRUB_DISABLE_SUBMENU) in
	y | yes | true) printf '%s, with Linux %s' "$DISTRIBUTOR" "$KERNEL" ;;
	*) printf 'Advanced options for %s>%s, with Linux %s' "$DISTRIBUTOR" "$DISTRIBUTOR" "$KERNEL" ;;
	esac
}

render_grub() {
	printf '%s: boot kernel %s by default; removed on uninstall.\n' "$MARKER" "$KERNEL"
	printf "# Change the package's configMap, not this file: the package's checks fail on any change.\n"
	printf 'GRUB_DEFAULT="%s"\n' "$(grub_entry)"
}

# grub_setting NAME: the GRUB setting NAME after /etc/default/grub and grub.d/*.cfg, sourced as
# update-grub sources them (a later file wins).
grub_setting() {
	(
		set +eu
		eval "$1="
		for _file in "$HOST/etc/default/grub" "$HOST"/etc/default/grub.d/*.cfg; do
			# shellcheck disable=SC1090 # the node's own files, as update-grub reads them
			if [ -f "$_file" ]; then . "$_file" >/dev/null 2>&1; fi
		done
		eval "printf '%s' \"\$$1\""
	)
}

effective_grub_default() {
	grub_setting GRUB_DEFAULT
}

# grubby_default: the kernel grubby boots by default (a path such as /boot/vmlinuz-<release>).
grubby_default() {
	"$GRUBBY" --default-kernel
}

# ----------------------------------------------------------------------------------------------------
# EFA

# efa_url VERSION: where the installer of VERSION is (EFA_URL with every {version} replaced).
efa_url() {
	_rest=$EFA_URL
	_url=
	while :; do
		case $_rest in
		*'{version}'*)
			_url="$_url${_rest%%\{version\}*}$1"
			_rest=${_rest#*\{version\}}
			;;
		*)
			printf '%s' "$_url$_rest"
			return 0
			;;
		esac
	done
}

# installed_efa: the version of the EFA installer that installed what is on the node, or none.
installed_efa() {
	if [ -f "$HOST$EFA_PACKAGES_FILE" ]; then
		while IFS= read -r _line; do
			case $_line in "# EFA installer version: "*)
				printf '%s' "${_line#"# EFA installer version: "}"
				return 0
				;;
			esac
		done <"$HOST$EFA_PACKAGES_FILE"
		printf 'unknown'
		return 0
	fi
	printf 'none'
}

# efa_loaded: the efa module is in the running kernel.
efa_loaded() {
	[ -f "$HOST/proc/modules" ] || return 1
	while read -r _module _rest; do
		if [ "$_module" = efa ]; then return 0; fi
	done <"$HOST/proc/modules"
	return 1
}

# efa_devices: how many RDMA devices the efa driver drives (/sys/class/infiniband/*/device/driver).
efa_devices() {
	_count=0
	for _device in "$HOST"/sys/class/infiniband/*; do
		[ -e "$_device" ] || [ -L "$_device" ] || continue
		_driver=$(readlink "$_device/device/driver" 2>/dev/null || true)
		case $_driver in */efa) _count=$((_count + 1)) ;; esac
	done
	printf '%s' "$_count"
}

# efa_provider: libfabric's efa provider answers (fi_info -p efa -t FI_EP_RDM, AWS's own verification).
efa_provider() {
	[ -x "$HOST$FI_INFO" ] || return 1
	_providers=$("$HOST$FI_INFO" -p efa -t FI_EP_RDM 2>/dev/null) || return 1
	case $_providers in *"provider: efa"*) return 0 ;; esac
	return 1
}

render_modules() {
	printf '%s: load the EFA driver at every boot; removed on uninstall.\nefa\n' "$MARKER"
}

# ours FILE: FILE (a host path) was written by this package.
ours() {
	[ -f "$HOST$1" ] || return 1
	IFS= read -r _first <"$HOST$1" || true
	case $_first in "$MARKER"*) return 0 ;; *) return 1 ;; esac
}
