#!/bin/sh
# The first process of a real node's box: PID 1 of its new PID namespace, in its own mount, network, UTS
# and IPC namespaces (unshare --propagation private: no mount made here is seen by the machine). It
# builds the node's root and hands over to the node's init. Run by nodewright.sim.box with the
# machine's /bin/sh and util-linux; nothing of the box's own root is executed before the pivot.
#
#   stage1.sh NODE_DIR LOWERDIRS SNAPSHOT_DIR
#
# NODE_DIR holds upper/ and work/ (the node's disk), merged/ (the mount point), containerd/ (containerd's
# state: overlayfs cannot be an upper directory on overlayfs) and net.fifo (a line arrives when the node's
# network link is in place); SNAPSHOT_DIR/sysctl and sysctl-netcore are the kernel values the box starts
# from (nodewright.sim.box.snapshot_sysctl).
set -eu
N=$1
LOWER=$2
SNAP=$3
M=$N/merged
# util-linux's mount records some mounts in /run/mount/utab, the machine's file until the pivot: keep
# that record in the node's directory instead.
export LIBMOUNT_UTAB="$N/utab"

read -r _wired < "$N/net.fifo"

mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$N/upper,workdir=$N/work" "$M"
mount -t proc proc "$M/proc"

# /proc/sys: the node's own copy of the kernel's tunables (a package's `sysctl -w vm.swappiness=1` must
# never reach the machine), except net/, which is per network namespace and so the box's own for real;
# net/core is copied too, since some of its keys exist only in the machine's first namespace.
mkdir -p "$N/realnet"
mount --bind "$M/proc/sys/net" "$N/realnet"
mount -t tmpfs -o mode=0555,size=4m sysctl "$M/proc/sys"
cp -a "$SNAP/sysctl/." "$M/proc/sys/"
mkdir -p "$M/proc/sys/net"
mount --move "$N/realnet" "$M/proc/sys/net"
mount -t tmpfs -o mode=0555,size=1m netcore "$M/proc/sys/net/core"
cp -a "$SNAP/sysctl-netcore/." "$M/proc/sys/net/core/"
# A new boot ID per boot, which the kubelet reports as status.nodeInfo.bootID.
cat /proc/sys/kernel/random/uuid > "$M/proc/sys/kernel/random/boot_id"
# What the kubelet checks with protectKernelDefaults (it would otherwise write them on the machine).
echo 1 > "$M/proc/sys/vm/overcommit_memory"
echo 10 > "$M/proc/sys/kernel/panic"
echo 1 > "$M/proc/sys/kernel/panic_on_oops"
# Files the node's boot fills in (its kernel command line, its loaded modules) over /proc.
# (A kernel without loadable modules has no /proc/modules: then the box keeps its list in /run.)
for f in cmdline modules; do
	[ -e "$M/proc/$f" ] || continue
	: > "$N/kernel-$f"
	mount --bind "$N/kernel-$f" "$M/proc/$f"
done

mount -t sysfs -o ro sysfs "$M/sys"
mount -t tmpfs -o mode=0755,size=1m cgroup "$M/sys/fs/cgroup"
for h in /sys/fs/cgroup/*; do
	[ -d "$h" ] || continue
	mkdir -p "$M$h"
	mount --rbind "$h" "$M$h"
done

# /dev: the harmless devices only. No disk, no /dev/mem: a privileged pod sees what the box has.
mount -t tmpfs -o mode=0755,size=64k dev "$M/dev"
for d in null zero full random urandom tty; do
	touch "$M/dev/$d"
	mount --bind "/dev/$d" "$M/dev/$d"
done
# The kubelet's OOM watcher reads /dev/kmsg; the box gives it an empty one, not the machine's log.
touch "$M/dev/kmsg"
mount --bind /dev/null "$M/dev/kmsg"
mkdir -p "$M/dev/pts" "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$M/dev/pts"
ln -s pts/ptmx "$M/dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$M/dev/shm"
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"
ln -s /proc/self/fd/1 "$M/dev/stdout"
ln -s /proc/self/fd/2 "$M/dev/stderr"

mount -t tmpfs -o mode=0755 run "$M/run"
mkdir -p "$M/var/lib/containerd"
mount --bind "$N/containerd" "$M/var/lib/containerd"

hostname "$(cat "$M/etc/hostname")"
# The services the node's init starts (nodewright.sim box layer: /etc/nodewright-box/inittab-gen).
"$M/bin/busybox" sh "$M/etc/nodewright-box/inittab-gen" "$M" > "$M/etc/inittab"

mkdir -p "$M/.oldroot"
cd "$M"
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
# Shared, as a systemd host's root is: the kubelet's HostToContainer mounts of / need it.
mount --make-rshared /
exec /sbin/init
