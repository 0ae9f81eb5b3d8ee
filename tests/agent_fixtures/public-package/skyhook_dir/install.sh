#!/bin/sh
# A package written for the reference agent: host paths, run chrooted into the host root.
set -e
mkdir -p /etc/public-demo
{
  echo "node=$1"
  echo "args=$*"
  echo "color=$DEMO_COLOR"
  echo "cwd=$(pwd)"
  echo "step_root=$STEP_ROOT"
  echo "skyhook_dir=$SKYHOOK_DIR"
  echo "path=$PATH"
} > /etc/public-demo/install.env
ls / > /etc/public-demo/root-listing
echo "installed for $1"
# 2 is listed in returncodes: success, "installed, reboot wanted" in this package's convention.
exit 2
