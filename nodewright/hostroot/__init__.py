"""A directory that stands for a node's root file system, and what a node does to it.

A package's steps and checks see a node through its files: the sysctl files and `/proc/sys`, the GRUB
defaults and `/proc/cmdline`, `/etc/modules` and `/proc/modules`, the boot loader's default kernel. Where
the root is a directory on this machine (`nodewright package run`, the simulator's nodes), something has
to play the node's part on those files, and it must play it the same way everywhere, or a package that
passes locally fails on the simulated fleet:

- `boot`: what a boot does to the root (the running kernel state rebuilt from the persistent files), used
  by `nodewright package run interrupt` (a reboot interrupt), the simulated kubelet (a node first seen, a
  new bootID) and the reference package tests;
- `hostshims`: stand-ins for the node's commands (`reboot`, `sysctl`, `systemctl`, `modprobe`, the package
  manager, ...) that act on the root instead of this machine, and what an interrupt's commands do.

Standard library only, and nothing else of NodeWright (import-linter keeps it so): the stand-in scripts
import it in a bare interpreter, and both `nodewright.packaging` and `nodewright.sim` build on it.
"""
