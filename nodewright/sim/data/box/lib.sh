# Shared by the box's boot, systemctl and service (sourced; busybox sh). What a distribution's boot and
# service manager do, on the files a package writes: nothing here touches the machine, every path is the
# node's own (the box's root, its /proc/sys copy, its mount namespace).

# boot_cmdline: what the boot loader would pass to the kernel, from /etc/default/grub and grub.d/*.cfg.
boot_cmdline() {
	(
		GRUB_CMDLINE_LINUX= GRUB_CMDLINE_LINUX_DEFAULT=
		for f in /etc/default/grub /etc/default/grub.d/*.cfg; do
			[ -f "$f" ] && . "$f" >/dev/null 2>&1
		done
		# shellcheck disable=SC2086 # one space between words, as grub writes it
		echo BOOT_IMAGE=/boot/vmlinuz-$(uname -r) root=/dev/vda ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT
	)
}

# The node's list of loaded modules: /proc/modules (the box's own file), or a file in /run on a kernel
# built without loadable modules.
if [ -e /proc/modules ]; then MODULES=/proc/modules; else MODULES=/run/nodewright-box/modules; fi

# boot_modules: /proc/modules of a fresh boot, from /etc/modules and /etc/modules-load.d/*.conf.
boot_modules() {
	for f in /etc/modules /etc/modules-load.d/*.conf; do
		[ -f "$f" ] || continue
		sed -e 's/#.*//' -e 's/;.*//' "$f" | while read -r name _rest; do
			[ -n "$name" ] && echo "$name" | tr - _
		done
	done | awk '!seen[$0]++ { print $0 " 16384 0 - Live 0x0000000000000000" }'
}

# boot_sysctl: the sysctl files in `sysctl --system` order (the first directory holding a name wins).
boot_sysctl() {
	seen=" "
	for d in /etc/sysctl.d /run/sysctl.d /usr/local/lib/sysctl.d /usr/lib/sysctl.d /lib/sysctl.d; do
		for f in "$d"/*.conf; do
			[ -f "$f" ] || continue
			case $seen in *" ${f##*/} "*) continue ;; esac
			seen="$seen${f##*/} "
			sysctl -q -p "$f" >/dev/null 2>&1 || echo "boot: $f did not load completely" >&2
		done
	done
	if [ -f /etc/sysctl.conf ]; then sysctl -q -p /etc/sysctl.conf >/dev/null 2>&1 || true; fi
}

# boot_cgroups: the node's cgroup root in every hierarchy (cpuset children start empty: copy cpus, mems).
boot_cgroups() {
	root=$(cat /etc/nodewright-box/cgroup-root)
	for h in /sys/fs/cgroup/*; do
		[ -d "$h" ] || continue
		p=$h
		for part in $(echo "$root" | tr / ' '); do
			parent=$p
			p=$p/$part
			mkdir -p "$p"
			if [ -f "$p/cpuset.cpus" ] && [ -z "$(cat "$p/cpuset.cpus")" ]; then
				cat "$parent/cpuset.cpus" > "$p/cpuset.cpus"
				cat "$parent/cpuset.mems" > "$p/cpuset.mems"
			fi
		done
	done
}

# unit_field UNIT KEY: a Key= value of a mount unit in /etc/systemd/system.
unit_field() {
	sed -n "s/^$2=//p" "/etc/systemd/system/$1" | tail -n 1
}

# mount_unit UNIT: mount what the unit describes in the node's mount namespace (init's, PID 1's: the
# caller may be a package pod sharing the node's PID namespace, whose own mounts nobody else sees).
mount_unit() {
	what=$(unit_field "$1" What)
	where=$(unit_field "$1" Where)
	options=$(unit_field "$1" Options)
	[ -n "$what" ] && [ -n "$where" ] || { echo "$1: no What= or Where=" >&2; return 1; }
	if grep -q " $where " /proc/1/mountinfo; then return 0; fi
	mkdir -p "$where"
	nsenter -t 1 -m -- mount -o "${options:-defaults}" "$what" "$where"
}

unmount_unit() {
	where=$(unit_field "$1" Where)
	[ -n "$where" ] || return 0
	if grep -q " $where " /proc/1/mountinfo; then nsenter -t 1 -m -- umount "$where"; fi
}

# boot_mounts: /etc/fstab (bind and tmpfs lines; the node has no disks of its own to mount) and the
# mount units enabled in local-fs.target.wants, as systemd mounts them at boot.
boot_mounts() {
	if [ -f /etc/fstab ]; then
		sed -e 's/#.*//' /etc/fstab | while read -r what where type options _rest; do
			[ -n "$where" ] || continue
			case ",$options," in *,bind,* | *,rbind,*) ;; *) [ "$type" = tmpfs ] || continue ;; esac
			mkdir -p "$where"
			mount -t "$type" -o "$options" "$what" "$where" || echo "boot: fstab $where did not mount" >&2
		done
	fi
	for unit in /etc/systemd/system/local-fs.target.wants/*.mount; do
		[ -e "$unit" ] || continue
		mount_unit "${unit##*/}" || echo "boot: ${unit##*/} did not mount" >&2
	done
}
